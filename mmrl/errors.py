"""The error a user's input raises: a module of its own, at the bottom of the core, so that any module can raise
it without importing the config (which imports the checks, which import the algorithms)."""


class ConfigError(ValueError):
    """A user error in the configuration (the CLI prints it and exits with code 2)."""
