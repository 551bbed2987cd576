"""What only the book needs: its figures (one module per chapter, :mod:`.figures`), the pitfall
demos, loading the recorded results and the seed article's published figures."""
