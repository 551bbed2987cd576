"""The book's figures, one module per chapter, all drawn in :mod:`.style`."""
