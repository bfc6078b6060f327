"""The harness's errors a user can act on."""


class StudyError(ValueError):
    """The message is one line naming the key, file or trial and the fix (printed as `error: ...`)."""
