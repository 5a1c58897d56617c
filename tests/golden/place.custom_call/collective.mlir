// golden lowering: place.custom_call / collective; jax 0.10.2, jaxlib 0.10.2; python scripts/update_golden.py
module @golden attributes {mhlo.num_partitions = 1 : i32, mhlo.num_replicas = 1 : i32} {
  func.func public @main(%arg0: tensor<1024xf32>) -> (tensor<1024xf32> {jax.result_info = "result"}) {
    %0 = stablehlo.optimization_barrier %arg0 : tensor<1024xf32>
    %1 = stablehlo.custom_call @gpuext_place(%0) {backend_config = "", mhlo.backend_config = {}, mhlo.frontend_attributes = {results_memory_spaces = "{0:1}"}, operand_layouts = [dense<0> : tensor<1xindex>], result_layouts = [dense<0> : tensor<1xindex>]} : (tensor<1024xf32>) -> tensor<1024xf32>
    %2 = stablehlo.optimization_barrier %1 : tensor<1024xf32>
    return %2 : tensor<1024xf32>
  }
}
