"""The hand-written C++ kernels, one source per op family, and their headers; built on first use with the system's compiler."""
