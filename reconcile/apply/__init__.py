"""The apply stage: the executor, its lock, and the state kept between runs (generations)."""
