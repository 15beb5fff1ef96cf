"""User-facing errors: one line that names the file, the field and what to do."""


class UserError(Exception):
    """A mistake in the user's input. The CLI prints ``str(err)`` alone and exits 2."""

    exit_code = 2


def located(path, field: str, problem: str) -> UserError:
    where = f"{path}: {field}: " if field else f"{path}: "
    return UserError(where + problem)
