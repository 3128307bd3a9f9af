"""Synthetic historical writers in the HisFrag20 layout: the demo's draw (synth), the validation family and the third draw (synth_val), and the organisers' fragment cuts (fragments)."""
