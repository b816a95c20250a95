"""Where features meet: each test joins two or more (several queues, limits, keys, cancels,
locks, NOTIFY off, parents, batches, several databases) and is named after the rules it joins."""
