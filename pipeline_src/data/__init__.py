"""Job-time data: the sample store, sharding, the backbone."""
