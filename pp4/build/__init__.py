"""The build folder's own documents (`build/pp4.json`, ...): their paths, their format version, and
the one place they are read and written (pp4/build/config.py)."""
