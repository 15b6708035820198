"""The one exception type for user mistakes.

A `ConfigError` means the user can fix it: its message names the offending key (config key,
flag, path or device) and says how. Entry points print it as a single line and exit with
status 2 instead of showing a traceback; anything else is a bug and keeps its traceback.
"""


class ConfigError(ValueError):
    """A bad config key, value, flag, path or device, raised before any process starts."""
