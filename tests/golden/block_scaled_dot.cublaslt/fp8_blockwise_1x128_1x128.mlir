// golden lowering: block_scaled_dot.cublaslt / fp8_blockwise_1x128_1x128; jax 0.10.2, jaxlib 0.10.2; python scripts/update_golden.py
module @golden attributes {mhlo.num_partitions = 1 : i32, mhlo.num_replicas = 1 : i32} {
  func.func public @main(%arg0: tensor<40x256xf8E4M3FN>, %arg1: tensor<40x2xf32>, %arg2: tensor<128x256xf8E4M3FN>, %arg3: tensor<128x2xf32>) -> (tensor<40x128xf32> {jax.result_info = "result"}) {
    %0 = stablehlo.reshape %arg0 : (tensor<40x256xf8E4M3FN>) -> tensor<1x40x256xf8E4M3FN>
    %1 = stablehlo.reshape %arg1 : (tensor<40x2xf32>) -> tensor<1x40x2xf32>
    %2 = stablehlo.reshape %arg2 : (tensor<128x256xf8E4M3FN>) -> tensor<1x128x256xf8E4M3FN>
    %3 = stablehlo.reshape %arg3 : (tensor<128x2xf32>) -> tensor<1x128x2xf32>
    %c = stablehlo.constant dense<0> : tensor<i32>
    %4 = call @_pad(%0, %c) : (tensor<1x40x256xf8E4M3FN>, tensor<i32>) -> tensor<1x48x256xf8E4M3FN>
    %c_0 = stablehlo.constant dense<1> : tensor<i32>
    %5 = call @_pad_0(%1, %c_0) : (tensor<1x40x2xf32>, tensor<i32>) -> tensor<1x48x2xf32>
    %6 = stablehlo.transpose %5, dims = [0, 2, 1] : (tensor<1x48x2xf32>) -> tensor<1x2x48xf32>
    %7 = stablehlo.reshape %6 : (tensor<1x2x48xf32>) -> tensor<1x96xf32>
    %8 = stablehlo.transpose %3, dims = [0, 2, 1] : (tensor<1x128x2xf32>) -> tensor<1x2x128xf32>
    %9 = stablehlo.reshape %8 : (tensor<1x2x128xf32>) -> tensor<1x256xf32>
    %cst = stablehlo.constant dense<1.000000e+00> : tensor<f32>
    %cst_1 = stablehlo.constant dense<1.000000e+00> : tensor<f32>
    %10 = stablehlo.multiply %cst, %cst_1 : tensor<f32>
    %11 = stablehlo.reshape %10 : (tensor<f32>) -> tensor<1xf32>
    %cst_2 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %12 = stablehlo.broadcast_in_dim %cst_2, dims = [] : (tensor<f32>) -> tensor<1xf32>
    %13 = stablehlo.concatenate %11, %12, dim = 0 : (tensor<1xf32>, tensor<1xf32>) -> tensor<2xf32>
    %14:2 = stablehlo.custom_call @gpuext_block_scaled_dot_cublaslt(%4, %7, %2, %9, %13) {backend_config = "", mhlo.backend_config = {k = 256 : i64, lhs_scale_mode = 4 : i32, lhs_type = 0 : i32, rhs_scale_mode = 4 : i32, rhs_type = 0 : i32}, operand_layouts = [dense<[2, 1, 0]> : tensor<3xindex>, dense<[1, 0]> : tensor<2xindex>, dense<[2, 1, 0]> : tensor<3xindex>, dense<[1, 0]> : tensor<2xindex>, dense<0> : tensor<1xindex>], result_layouts = [dense<[2, 1, 0]> : tensor<3xindex>, dense<0> : tensor<1xindex>]} : (tensor<1x48x256xf8E4M3FN>, tensor<1x96xf32>, tensor<1x128x256xf8E4M3FN>, tensor<1x256xf32>, tensor<2xf32>) -> (tensor<1x48x128xf32>, tensor<33554688xui8>)
    %15 = stablehlo.slice %14#0 [0:1, 0:40, 0:128] : (tensor<1x48x128xf32>) -> tensor<1x40x128xf32>
    %16 = stablehlo.reshape %15 : (tensor<1x40x128xf32>) -> tensor<40x128xf32>
    return %16 : tensor<40x128xf32>
  }
  func.func private @_pad(%arg0: tensor<1x40x256xf8E4M3FN>, %arg1: tensor<i32>) -> tensor<1x48x256xf8E4M3FN> {
    %0 = stablehlo.convert %arg1 : (tensor<i32>) -> tensor<f8E4M3FN>
    %1 = stablehlo.pad %arg0, %0, low = [0, 0, 0], high = [0, 8, 0], interior = [0, 0, 0] : (tensor<1x40x256xf8E4M3FN>, tensor<f8E4M3FN>) -> tensor<1x48x256xf8E4M3FN>
    return %1 : tensor<1x48x256xf8E4M3FN>
  }
  func.func private @_pad_0(%arg0: tensor<1x40x2xf32>, %arg1: tensor<i32>) -> tensor<1x48x2xf32> {
    %0 = stablehlo.convert %arg1 : (tensor<i32>) -> tensor<f32>
    %1 = stablehlo.pad %arg0, %0, low = [0, 0, 0], high = [0, 8, 0], interior = [0, 0, 0] : (tensor<1x40x2xf32>, tensor<f32>) -> tensor<1x48x2xf32>
    return %1 : tensor<1x48x2xf32>
  }
}
