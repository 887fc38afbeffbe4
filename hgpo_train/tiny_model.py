"""Moved: ``python -m hgpo_train tiny-model`` (:mod:`hgpo_train.update.tiny_model`). This old path goes after release 0.1."""

MOVED = "python -m hgpo_train.tiny_model is now python -m hgpo_train tiny-model (module hgpo_train.update.tiny_model)"
raise SystemExit(MOVED) if __name__ == "__main__" else ImportError(MOVED)
