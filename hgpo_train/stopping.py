"""Moved: ``python -m hgpo_train stop`` (:mod:`hgpo_train.run.stopping`). This old path goes after release 0.1."""

MOVED = "python -m hgpo_train.stopping is now python -m hgpo_train stop (module hgpo_train.run.stopping)"
raise SystemExit(MOVED) if __name__ == "__main__" else ImportError(MOVED)
