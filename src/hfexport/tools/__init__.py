"""Tools that run on top of the library: the support matrix, quantized agreement."""
