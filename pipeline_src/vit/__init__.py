"""timm VisionTransformer utilities shared by the method libraries (a leaf library: it imports
only torch and timm): the frozen prefix, the trainable tail, a fresh head, a model whose forward
starts from prefix activations (`parts`), and the digest that names a backbone (`digest`)."""
