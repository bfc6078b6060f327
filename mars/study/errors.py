"""The study's one error: a spec value, a storage, a study dir or a trial that cannot be used."""


class StudyError(ValueError):
    """The message is one line naming the key, file or trial and the fix (printed as `error: ...`)."""
