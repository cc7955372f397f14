"""A tensor-parallel rank's process (`python -m sv_engine.rank_main`, started by rank 0):
its `RankSpec` comes pickled on stdin from the parent that wrote it (sv_engine.ranks)."""

import pickle
import sys

from sv_engine.ranks import RankSpec, run_worker

spec = pickle.load(sys.stdin.buffer)
if not isinstance(spec, RankSpec):
    sys.exit(f"sv: a rank process expects a RankSpec on stdin, got {type(spec).__name__}")
run_worker(spec)
