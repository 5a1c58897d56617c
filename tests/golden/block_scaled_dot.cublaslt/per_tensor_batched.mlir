// golden lowering: block_scaled_dot.cublaslt / per_tensor_batched; jax 0.10.2, jaxlib 0.10.2; python scripts/update_golden.py
module @golden attributes {mhlo.num_partitions = 1 : i32, mhlo.num_replicas = 1 : i32} {
  func.func public @main(%arg0: tensor<3x64x256xf8E4M3FN>, %arg1: tensor<f32>, %arg2: tensor<3x128x256xf8E4M3FN>, %arg3: tensor<f32>) -> (tensor<3x64x128xf32> {jax.result_info = "result"}) {
    %0 = stablehlo.reshape %arg1 : (tensor<f32>) -> tensor<1xf32>
    %1 = stablehlo.broadcast_in_dim %0, dims = [0] : (tensor<1xf32>) -> tensor<3xf32>
    %2 = stablehlo.reshape %1 : (tensor<3xf32>) -> tensor<3x1x1xf32>
    %3 = stablehlo.reshape %arg3 : (tensor<f32>) -> tensor<1xf32>
    %4 = stablehlo.broadcast_in_dim %3, dims = [0] : (tensor<1xf32>) -> tensor<3xf32>
    %5 = stablehlo.reshape %4 : (tensor<3xf32>) -> tensor<3x1x1xf32>
    %6 = stablehlo.reshape %2 : (tensor<3x1x1xf32>) -> tensor<3x1xf32>
    %c = stablehlo.constant dense<0> : tensor<i32>
    %7 = call @_pad(%6, %c) : (tensor<3x1xf32>, tensor<i32>) -> tensor<3x4xf32>
    %8 = stablehlo.reshape %5 : (tensor<3x1x1xf32>) -> tensor<3x1xf32>
    %c_0 = stablehlo.constant dense<0> : tensor<i32>
    %9 = call @_pad(%8, %c_0) : (tensor<3x1xf32>, tensor<i32>) -> tensor<3x4xf32>
    %cst = stablehlo.constant dense<1.000000e+00> : tensor<f32>
    %cst_1 = stablehlo.constant dense<1.000000e+00> : tensor<f32>
    %10 = stablehlo.multiply %cst, %cst_1 : tensor<f32>
    %11 = stablehlo.reshape %10 : (tensor<f32>) -> tensor<1xf32>
    %cst_2 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %12 = stablehlo.broadcast_in_dim %cst_2, dims = [] : (tensor<f32>) -> tensor<1xf32>
    %13 = stablehlo.concatenate %11, %12, dim = 0 : (tensor<1xf32>, tensor<1xf32>) -> tensor<2xf32>
    %14:2 = stablehlo.custom_call @gpuext_block_scaled_dot_cublaslt(%arg0, %7, %arg2, %9, %13) {backend_config = "", mhlo.backend_config = {k = 256 : i64, lhs_scale_mode = 0 : i32, lhs_type = 0 : i32, rhs_scale_mode = 0 : i32, rhs_type = 0 : i32}, operand_layouts = [dense<[2, 1, 0]> : tensor<3xindex>, dense<[1, 0]> : tensor<2xindex>, dense<[2, 1, 0]> : tensor<3xindex>, dense<[1, 0]> : tensor<2xindex>, dense<0> : tensor<1xindex>], result_layouts = [dense<[2, 1, 0]> : tensor<3xindex>, dense<0> : tensor<1xindex>]} : (tensor<3x64x256xf8E4M3FN>, tensor<3x4xf32>, tensor<3x128x256xf8E4M3FN>, tensor<3x4xf32>, tensor<2xf32>) -> (tensor<3x64x128xf32>, tensor<33554688xui8>)
    return %14#0 : tensor<3x64x128xf32>
  }
  func.func private @_pad(%arg0: tensor<3x1xf32>, %arg1: tensor<i32>) -> tensor<3x4xf32> {
    %0 = stablehlo.convert %arg1 : (tensor<i32>) -> tensor<f32>
    %1 = stablehlo.pad %arg0, %0, low = [0, 0], high = [0, 3], interior = [0, 0] : (tensor<3x1xf32>, tensor<f32>) -> tensor<3x4xf32>
    return %1 : tensor<3x4xf32>
  }
}
