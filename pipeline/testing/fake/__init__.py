"""The fake cluster's implementation; the public entry is `pipeline.testing.fake_cluster`."""
