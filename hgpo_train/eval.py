"""Moved: ``python -m hgpo_train eval`` (:mod:`hgpo_train.evaluation.evaluate`). This old path goes after release 0.1."""

MOVED = "python -m hgpo_train.eval is now python -m hgpo_train eval (module hgpo_train.evaluation.evaluate)"
raise SystemExit(MOVED) if __name__ == "__main__" else ImportError(MOVED)
