"""Pages: the release page a team reads, every published cell on its torch × CUDA grid with what was tested, what
is inside and how to start it."""
