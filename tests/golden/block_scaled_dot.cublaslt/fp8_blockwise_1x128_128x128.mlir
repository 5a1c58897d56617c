// golden lowering: block_scaled_dot.cublaslt / fp8_blockwise_1x128_128x128; jax 0.10.2, jaxlib 0.10.2; python scripts/update_golden.py
module @golden attributes {mhlo.num_partitions = 1 : i32, mhlo.num_replicas = 1 : i32} {
  func.func public @main(%arg0: tensor<64x256xf8E4M3FN>, %arg1: tensor<64x2xf32>, %arg2: tensor<128x256xf8E4M3FN>, %arg3: tensor<1x2xf32>) -> (tensor<64x128xbf16> {jax.result_info = "result"}) {
    %0 = stablehlo.reshape %arg0 : (tensor<64x256xf8E4M3FN>) -> tensor<1x64x256xf8E4M3FN>
    %1 = stablehlo.reshape %arg1 : (tensor<64x2xf32>) -> tensor<1x64x2xf32>
    %2 = stablehlo.reshape %arg2 : (tensor<128x256xf8E4M3FN>) -> tensor<1x128x256xf8E4M3FN>
    %3 = stablehlo.reshape %arg3 : (tensor<1x2xf32>) -> tensor<1x1x2xf32>
    %4 = stablehlo.transpose %1, dims = [0, 2, 1] : (tensor<1x64x2xf32>) -> tensor<1x2x64xf32>
    %5 = stablehlo.reshape %4 : (tensor<1x2x64xf32>) -> tensor<1x128xf32>
    %c = stablehlo.constant dense<0> : tensor<i32>
    %6 = call @_pad(%3, %c) : (tensor<1x1x2xf32>, tensor<i32>) -> tensor<1x1x4xf32>
    %7 = stablehlo.reshape %6 : (tensor<1x1x4xf32>) -> tensor<1x4xf32>
    %cst = stablehlo.constant dense<1.000000e+00> : tensor<f32>
    %cst_0 = stablehlo.constant dense<1.000000e+00> : tensor<f32>
    %8 = stablehlo.multiply %cst, %cst_0 : tensor<f32>
    %9 = stablehlo.reshape %8 : (tensor<f32>) -> tensor<1xf32>
    %cst_1 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %10 = stablehlo.broadcast_in_dim %cst_1, dims = [] : (tensor<f32>) -> tensor<1xf32>
    %11 = stablehlo.concatenate %9, %10, dim = 0 : (tensor<1xf32>, tensor<1xf32>) -> tensor<2xf32>
    %12:2 = stablehlo.custom_call @gpuext_block_scaled_dot_cublaslt(%0, %5, %2, %7, %11) {backend_config = "", mhlo.backend_config = {k = 256 : i64, lhs_scale_mode = 4 : i32, lhs_type = 0 : i32, rhs_scale_mode = 5 : i32, rhs_type = 0 : i32}, operand_layouts = [dense<[2, 1, 0]> : tensor<3xindex>, dense<[1, 0]> : tensor<2xindex>, dense<[2, 1, 0]> : tensor<3xindex>, dense<[1, 0]> : tensor<2xindex>, dense<0> : tensor<1xindex>], result_layouts = [dense<[2, 1, 0]> : tensor<3xindex>, dense<0> : tensor<1xindex>]} : (tensor<1x64x256xf8E4M3FN>, tensor<1x128xf32>, tensor<1x128x256xf8E4M3FN>, tensor<1x4xf32>, tensor<2xf32>) -> (tensor<1x64x128xbf16>, tensor<33554688xui8>)
    %13 = stablehlo.reshape %12#0 : (tensor<1x64x128xbf16>) -> tensor<64x128xbf16>
    return %13 : tensor<64x128xbf16>
  }
  func.func private @_pad(%arg0: tensor<1x1x2xf32>, %arg1: tensor<i32>) -> tensor<1x1x4xf32> {
    %0 = stablehlo.convert %arg1 : (tensor<i32>) -> tensor<f32>
    %1 = stablehlo.pad %arg0, %0, low = [0, 0, 0], high = [0, 0, 2], interior = [0, 0, 0] : (tensor<1x1x2xf32>, tensor<f32>) -> tensor<1x1x4xf32>
    return %1 : tensor<1x1x4xf32>
  }
}
