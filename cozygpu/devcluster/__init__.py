"""The local control plane: etcd and kube-apiserver on loopback, built from source.

This is the project's envtest: the tests and `cozygpu cluster start` use the
same code, so what the tests exercise is what a developer runs.
"""
