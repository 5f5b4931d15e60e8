"""Errors carry raises, each with the exit status the CLI gives it."""


class CarryError(Exception):
    """A failure carry reports in one line; `exit_code` is what the process exits with."""

    exit_code = 1


class BadInput(CarryError):
    """The user's input (config, VERSION, patches, flags) is wrong: one line naming it and the fix, exit 2."""

    exit_code = 2


class Failed(CarryError):
    """The input was fine but the job did not succeed (a patch failed, a build broke): exit 1."""

    exit_code = 1
