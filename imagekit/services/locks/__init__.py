"""Locking a cell: the resolver asked, the lock verified and written, Debian's .debs, a project's own metadata and
requirement forms, init's axes, the compatibility data's refresh."""
