"""The dispatch actor system (pykka). Built in issue [2 of 3]."""

__all__: list[str] = []
