"""A corner for tests and demos: the contextual-bandit policy that proves the loop (`bandit`) and the cache of
tiny models built in code (`tiny`)."""
