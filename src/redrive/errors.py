"""Errors users see: each names the setting or input at fault and how to fix it."""

from __future__ import annotations


class RedriveError(Exception):
    """Base class of the errors redrive raises on purpose."""


class ConfigError(RedriveError):
    """A setting is wrong or the machine lacks something; stops start-up with a fix.

    ``setting`` names the setting (an option, an environment variable, a program),
    ``problem`` says what is wrong with it and ``fix`` what to do about it.
    """

    def __init__(self, setting: str, problem: str, fix: str = "") -> None:
        self.setting = setting
        self.problem = problem
        self.fix = fix
        text = f"{setting}: {problem}"
        if fix:
            text += f"\n  fix: {fix}"
        super().__init__(text)
