"""The fragment retrieval task (HisFrag20): reader, data, model, losses, evaluator, metrics and the distance-matrix export."""
