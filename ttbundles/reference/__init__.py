"""Reference generators: readable torch implementations of the generator contract."""
