"""Evaluation tasks. ``synthetic`` holds the suite the embedded model is trained and tested on."""
