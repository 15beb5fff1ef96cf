"""Who wrote an artifact: the key that signs what this machine stores, and the check of others'.

The store lives in the workspace, which a CI cache saves and restores: whoever controls
that cache can rewrite any file in it, digests included. So trust cannot come from the store.
Each artifact is signed with a key kept outside it: per user and machine, a 32-byte ed25519
seed made on first use in `$XDG_CONFIG_HOME/magpie/signing-key` (`~/.config/magpie/`, mode
0600), or in CI a secret, `MAGPIE_SIGNING_KEY` (64 hex digits), which the CLI takes out of
its environment before anything starts, so that no process it starts (code under test among
them) inherits it.

What is signed is `artifact_message(task, key, files)`: the task's name, the artifact's key
and every file's [size, sha256], so a signature holds for that artifact alone. Beside the
signature each artifact carries a MAC of the same message and the signature under a key
derived from the same secret: the check this machine makes of what it wrote itself, with no
import of `cryptography` (0.05 s, more than a no-op build's whole budget beyond doit's); an
artifact whose MAC fails (made elsewhere, or its signature file touched) is judged by its
ed25519 signature and its signer's place among the trusted ones. The no-op build's snapshot
of stamps is MAC'd with another derived key (`snapshot_mac`): a stamp lets an artifact be
trusted unread, so a stamp must come from this secret's holder too.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import tempfile
from pathlib import Path

from magpie.environment import SIGNING_KEY
from magpie.errors import UserError

SCHEME = "ed25519:"
KEY_FILE = "signing-key"
TRUSTED_FILE = "trusted-signers"  # one "ed25519:<hex>" a line; '#' starts a comment

_secret: list[bytes] = []  # the seed, once read (the environment's is kept here once taken out)
_from_environment: list[bool] = [False]
_made: dict = {}  # (seed, what) -> derived MAC keys and the key objects, made once a process


def config_dir() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(base) / "magpie"


def take_secret_from_environment() -> None:
    """Called first thing by the CLI (and by each `Store` made): the CI secret leaves the
    environment every process started afterwards inherits, and stays in this process's memory alone."""
    value = os.environ.pop(SIGNING_KEY, "").strip()
    if value:  # an empty one (how CI passes a secret not defined) is none: this user's key file serves
        _secret[:] = [_parse_seed(value, f"the environment variable {SIGNING_KEY}")]
        _from_environment[0] = True


def secret_from_environment() -> bool:
    return _from_environment[0]


def _parse_seed(text: str, where: str) -> bytes:
    try:
        seed = bytes.fromhex(text)
    except ValueError:
        seed = b""
    if len(seed) != 32:
        raise UserError(
            f"{where}: not an ed25519 key: give 64 hex digits (e.g. from "
            f'`python -c "import secrets; print(secrets.token_hex(32))"`)'
        )
    return seed


def secret() -> bytes:
    """The seed: the CI secret if one was given, else this user's key file, made on first use."""
    if _secret:
        return _secret[0]
    path = config_dir() / KEY_FILE
    try:
        handle = open(path, "rb")
    except FileNotFoundError:
        _make_key_file(path)
        handle = open(path, "rb")
    with handle:
        st = os.fstat(handle.fileno())
        if st.st_uid != os.getuid() or st.st_mode & 0o077:
            raise UserError(
                f"{path}: the store's signing key must be yours and readable by you alone "
                f"(mode {st.st_mode & 0o777:o}, owner uid {st.st_uid}): chmod 600 it, or remove it "
                f"and a new key is made (what the old one signed is then rebuilt)"
            )
        seed = _parse_seed(handle.read().decode(errors="replace").strip(), str(path))
    _secret[:] = [seed]
    return seed


def _make_key_file(path: Path) -> None:
    """Written whole under a temporary name and linked into place: two builds starting at once
    end up with the same key (the second link fails, and its maker reads the first's)."""
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{KEY_FILE}.", dir=path.parent)  # mode 0600
    except OSError as err:
        raise UserError(
            f"{path}: cannot make the store's signing key ({err.strerror}): set XDG_CONFIG_HOME to a "
            f"folder of yours, or give a key in {SIGNING_KEY}"
        ) from None
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(os.urandom(32).hex() + "\n")
        os.link(tmp, path)
    except FileExistsError:
        pass
    finally:
        os.unlink(tmp)


def _derived(purpose: bytes) -> bytes:
    seed = secret()
    if (seed, purpose) not in _made:
        _made[seed, purpose] = hmac.new(seed, b"magpie " + purpose, hashlib.sha256).digest()
    return _made[seed, purpose]


def artifact_message(task: str | None, key: str, files: dict) -> bytes:
    """What an artifact's signature covers: the task, the key and every file's [size, sha256]."""
    body = json.dumps({"task": task, "key": key, "files": files}, sort_keys=True, separators=(",", ":"))
    return b"magpie artifact v1\n" + body.encode()


def artifact_mac(message: bytes, signer: str, signature: str) -> str:
    return hmac.new(
        _derived(b"artifact mac v1"), b"\n".join([message, signer.encode(), signature.encode()]), hashlib.sha256
    ).hexdigest()


def snapshot_mac(data: bytes) -> str:
    return hmac.new(_derived(b"graph snapshot mac v1"), data, hashlib.sha256).hexdigest()


def mac_matches(expected: str, given) -> bool:
    return isinstance(given, str) and hmac.compare_digest(expected, given)


def _private_key():
    seed = secret()
    if (seed, "private") not in _made:
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

        _made[seed, "private"] = Ed25519PrivateKey.from_private_bytes(seed)
    return _made[seed, "private"]


def public_key() -> str:
    """This machine's signer, as configured on others: "ed25519:" and 64 hex digits."""
    seed = secret()
    if (seed, "public") not in _made:
        from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

        _made[seed, "public"] = SCHEME + _private_key().public_key().public_bytes(Encoding.Raw, PublicFormat.Raw).hex()
    return _made[seed, "public"]


def sign(message: bytes) -> dict:
    """The contents of an artifact's signature file."""
    signer, signature = public_key(), _private_key().sign(message).hex()
    return {"signer": signer, "signature": signature, "mac": artifact_mac(message, signer, signature)}


def well_formed_signer(text) -> bool:
    """Whether text is "ed25519:" and 64 lowercase hex digits (one key, one spelling: signers are compared)."""
    return (
        isinstance(text, str)
        and text.startswith(SCHEME)
        and len(text) == len(SCHEME) + 64
        and set(text[len(SCHEME) :]) <= set("0123456789abcdef")
    )


def signature_valid(signer, signature, message: bytes) -> bool:
    if not well_formed_signer(signer) or not isinstance(signature, str):
        return False
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    try:
        Ed25519PublicKey.from_public_bytes(bytes.fromhex(signer[len(SCHEME) :])).verify(
            bytes.fromhex(signature), message
        )
    except (InvalidSignature, ValueError):
        return False
    return True


def user_trusted_signers() -> frozenset[str]:
    """The signers this user trusts in every project (`trusted-signers` beside the key)."""
    path = config_dir() / TRUSTED_FILE
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        return frozenset()
    except OSError as err:
        raise UserError(f"{path}: cannot read the trusted signers ({err.strerror})") from None
    signers = set()
    for number, line in enumerate(lines, 1):
        text = line.split("#", 1)[0].strip()
        if not text:
            continue
        if not well_formed_signer(text):
            raise UserError(
                f'{path}: line {number}: not a signer: give one "ed25519:" and 64 lowercase hex '
                f"digits a line (what `magpie key` prints on the machine to trust)"
            )
        signers.add(text)
    return frozenset(signers)
