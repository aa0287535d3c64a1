"""``form: unfused`` on the Ascend 950: the baseline chain of DeepEP-Ascend's A5 test
(tests/python/deepep/test_fused_deep_moe_a5.py run_small_op_baseline)."""
