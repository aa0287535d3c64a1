"""How far an op's time moves with its preset's assumed values, measured by running the
scenario again with each value perturbed (perturb: the runs, points of a sweep; reads:
the keys a run reads; records: the shipped records, configs/sensitivity/). It sits above
the sweep it runs through; a run's ledger reads the shipped records without running
anything (npusim.fidelity.assumed).
"""
