"""Imported first by rank programs that may run over two levels: with
GRADCOMM_TEST_RANKS_PER_NODE=L, rank r names its node node<r // L> (GRADCOMM_NODE), so that
ranks on this host form nodes of L ranks (docs/two-levels.md)."""
import os

_per_node = os.environ.get("GRADCOMM_TEST_RANKS_PER_NODE")
if _per_node:
    os.environ["GRADCOMM_NODE"] = f"node{int(os.environ['RANK']) // int(_per_node)}"
