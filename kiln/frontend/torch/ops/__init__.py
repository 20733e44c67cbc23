"""ATen import functions by op family: elementwise (math, activations, comparisons, casts), nn (matmuls,
convolutions, pooling, normalizations, softmax), shape (views, slicing, cat/stack/split, padding), indexing
(index_select, gather, embedding, index), reduce (sum/mean/max/..., var, any/all, cumsum)."""
