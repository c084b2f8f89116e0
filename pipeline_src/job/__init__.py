"""What a running job controls and counts about itself: glibc's allocator (`glibc_malloc`) and
its work counters (`counters`). A leaf: it imports nothing of the package, so every layer, the
algorithm libraries included, may use it."""
