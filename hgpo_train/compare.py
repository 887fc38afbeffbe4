"""Moved: ``python -m hgpo_train compare`` (:mod:`hgpo_train.evaluation.compare`). This old path goes after release 0.1."""

MOVED = (
    "python -m hgpo_train.compare is now python -m hgpo_train compare (module hgpo_train.evaluation.compare)"
)
raise SystemExit(MOVED) if __name__ == "__main__" else ImportError(MOVED)
