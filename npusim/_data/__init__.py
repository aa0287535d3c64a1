"""What ships with npusim as package data: npusim._data.configs (the hardware presets and
target tables) and npusim._data.scenarios (the shipped scenarios and sweeps).

Their files stay at the repository's top level (configs/, scenarios/); setup.py maps those
folders to these packages, so a wheel, an sdist and an editable install all find them with
importlib.resources. Read them through npusim.shipped.
"""
