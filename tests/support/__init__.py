"""Test support shared by the suites: fixture CRDs, identities, proxies."""
