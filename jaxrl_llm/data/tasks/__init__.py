"""Built-in tasks with exact, automatically checkable answers (see ``arithmetic``)."""
