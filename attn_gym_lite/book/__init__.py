"""What only the book needs: its figures (:mod:`.plots`), the pitfall demos (:mod:`.pitfalls`),
loading recorded results (:mod:`.results`) and the seed article's published figures (:mod:`.seed`)."""
