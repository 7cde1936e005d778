"""Server log parsers: numeric fields only, never raw text."""
