"""dpgate: a differentially private SQL gateway that enforces privacy budgets.

Importing this package has no side effects: no settings are read, no files or
databases are opened. See ``dpgate.service`` for the in-process pipeline and
``dpgate.api.app.create_app`` for the HTTP application factory.
"""

__version__ = "0.1.0"
