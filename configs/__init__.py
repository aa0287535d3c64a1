"""This folder is the package npusim._data.configs once installed (see setup.py)."""
