"""Every command of `python -m engine` and the options they share."""
