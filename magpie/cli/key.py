"""magpie key: this machine's signer, the public key that signs what its builds store."""

from __future__ import annotations

from magpie.environment import SIGNING_KEY


def add_parser(sub) -> None:
    p = sub.add_parser(
        "key",
        help="print this machine's public signing key (to trust its artifacts elsewhere)",
        description="Print the public key that signs every artifact this user's builds store "
        f"(from {SIGNING_KEY} where set, as in CI, else the key file, made on first "
        "use). Another machine uses those artifacts only once it is listed there, in "
        "magpie.toml's [store] trusted_signers or the user's trusted-signers file; the "
        "private key never leaves this machine.",
    )
    p.add_argument("--json", action="store_true", help="print the key and where it comes from as JSON")
    p.set_defaults(run=run)


def run(args) -> int:
    import json

    from magpie.store import signing

    signing.secret()  # the key file made first where there is none: where it is said below
    source = "the environment" if signing.secret_from_environment() else str(signing.config_dir() / signing.KEY_FILE)
    signer = signing.public_key()
    if args.json:
        print(
            json.dumps(
                {
                    "signer": signer,
                    "source": source,
                    "trusted_signers_file": str(signing.config_dir() / signing.TRUSTED_FILE),
                }
            )
        )
    else:
        print(signer)
    return 0
