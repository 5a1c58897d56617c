// golden lowering: ragged_dot.hopper / fp8_blockwise_gnk; jax 0.10.2, jaxlib 0.10.2; python scripts/update_golden.py
module @golden attributes {mhlo.num_partitions = 1 : i32, mhlo.num_replicas = 1 : i32} {
  func.func public @main(%arg0: tensor<48x256xf8E4M3FN>, %arg1: tensor<48x2xf32>, %arg2: tensor<3x128x256xf8E4M3FN>, %arg3: tensor<3x1x2xf32>, %arg4: tensor<3xi32>) -> (tensor<48x128xbf16> {jax.result_info = "result"}) {
    %0 = stablehlo.transpose %arg1, dims = [1, 0] : (tensor<48x2xf32>) -> tensor<2x48xf32>
    %c = stablehlo.constant dense<0> : tensor<i32>
    %1 = call @_pad(%0, %c) : (tensor<2x48xf32>, tensor<i32>) -> tensor<2x48xf32>
    %2:2 = stablehlo.custom_call @gpuext_ragged_dot_hopper(%arg0, %1, %arg2, %arg3, %arg4) {backend_config = "", mhlo.backend_config = {}, operand_layouts = [dense<[1, 0]> : tensor<2xindex>, dense<[1, 0]> : tensor<2xindex>, dense<[2, 1, 0]> : tensor<3xindex>, dense<[2, 1, 0]> : tensor<3xindex>, dense<0> : tensor<1xindex>], result_layouts = [dense<[1, 0]> : tensor<2xindex>, dense<0> : tensor<1xindex>]} : (tensor<48x256xf8E4M3FN>, tensor<2x48xf32>, tensor<3x128x256xf8E4M3FN>, tensor<3x1x2xf32>, tensor<3xi32>) -> (tensor<48x128xbf16>, tensor<1280xui8>)
    return %2#0 : tensor<48x128xbf16>
  }
  func.func private @_pad(%arg0: tensor<2x48xf32>, %arg1: tensor<i32>) -> tensor<2x48xf32> {
    %0 = stablehlo.convert %arg1 : (tensor<i32>) -> tensor<f32>
    %1 = stablehlo.pad %arg0, %0, low = [0, 0], high = [0, 0], interior = [0, 0] : (tensor<2x48xf32>, tensor<f32>) -> tensor<2x48xf32>
    return %1 : tensor<2x48xf32>
  }
}
