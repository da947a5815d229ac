"""The package version, on the lowest floor so that every layer (the CLI's --version, saved
sessions) can read it without importing the package's face."""

__version__ = "0.1.0"
