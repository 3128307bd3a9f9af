"""Image features of fragments: decoding, binarisation, ink-centred patches, SRS-LBP, aggregation, PCA and surrogate classes."""
