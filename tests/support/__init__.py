"""Code the tests share: servers, processes, clients, hostile inputs, the synthetic log
generator."""
