"""This folder is the package npusim._data.scenarios once installed (see setup.py)."""
