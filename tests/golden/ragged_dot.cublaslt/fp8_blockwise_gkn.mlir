// golden lowering: ragged_dot.cublaslt / fp8_blockwise_gkn; jax 0.10.2, jaxlib 0.10.2; python scripts/update_golden.py
module @golden attributes {mhlo.num_partitions = 1 : i32, mhlo.num_replicas = 1 : i32} {
  func.func public @main(%arg0: tensor<48x256xf8E4M3FN>, %arg1: tensor<48x2xf32>, %arg2: tensor<3x256x128xf8E4M3FN>, %arg3: tensor<3x2x1xf32>, %arg4: tensor<3xi32>) -> (tensor<48x128xbf16> {jax.result_info = "result"}) {
    %0 = stablehlo.transpose %arg2, dims = [0, 2, 1] : (tensor<3x256x128xf8E4M3FN>) -> tensor<3x128x256xf8E4M3FN>
    %1 = stablehlo.transpose %arg3, dims = [0, 2, 1] : (tensor<3x2x1xf32>) -> tensor<3x1x2xf32>
    %c = stablehlo.constant dense<0> : tensor<i32>
    %2 = call @_pad(%1, %c) : (tensor<3x1x2xf32>, tensor<i32>) -> tensor<3x1x4xf32>
    %3 = stablehlo.reshape %2 : (tensor<3x1x4xf32>) -> tensor<3x4xf32>
    %4:2 = stablehlo.custom_call @gpuext_ragged_dot_cublaslt(%arg0, %arg1, %0, %3, %arg4) {backend_config = "", mhlo.backend_config = {rhs_scale_mode = 5 : i32, row_align = 16 : i32}, operand_layouts = [dense<[1, 0]> : tensor<2xindex>, dense<[1, 0]> : tensor<2xindex>, dense<[2, 1, 0]> : tensor<3xindex>, dense<[1, 0]> : tensor<2xindex>, dense<0> : tensor<1xindex>], result_layouts = [dense<[1, 0]> : tensor<2xindex>, dense<0> : tensor<1xindex>]} : (tensor<48x256xf8E4M3FN>, tensor<48x2xf32>, tensor<3x128x256xf8E4M3FN>, tensor<3x4xf32>, tensor<3xi32>) -> (tensor<48x128xbf16>, tensor<33607168xui8>)
    return %4#0 : tensor<48x128xbf16>
  }
  func.func private @_pad(%arg0: tensor<3x1x2xf32>, %arg1: tensor<i32>) -> tensor<3x1x4xf32> {
    %0 = stablehlo.convert %arg1 : (tensor<i32>) -> tensor<f32>
    %1 = stablehlo.pad %arg0, %0, low = [0, 0, 0], high = [0, 0, 2], interior = [0, 0, 0] : (tensor<3x1x2xf32>, tensor<f32>) -> tensor<3x1x4xf32>
    return %1 : tensor<3x1x4xf32>
  }
}
