// golden lowering: block_scaled_dot.hopper_mx / nvfp4; jax 0.10.2, jaxlib 0.10.2; python scripts/update_golden.py
module @golden attributes {mhlo.num_partitions = 1 : i32, mhlo.num_replicas = 1 : i32} {
  func.func public @main(%arg0: tensor<64x256xf4E2M1FN>, %arg1: tensor<64x16xf8E4M3FN>, %arg2: tensor<f32>, %arg3: tensor<128x256xf4E2M1FN>, %arg4: tensor<128x16xf8E4M3FN>, %arg5: tensor<f32>) -> (tensor<64x128xf32> {jax.result_info = "result"}) {
    %0 = stablehlo.reshape %arg0 : (tensor<64x256xf4E2M1FN>) -> tensor<1x64x256xf4E2M1FN>
    %1 = stablehlo.reshape %arg1 : (tensor<64x16xf8E4M3FN>) -> tensor<1x64x16xf8E4M3FN>
    %2 = stablehlo.reshape %arg2 : (tensor<f32>) -> tensor<f32>
    %3 = stablehlo.reshape %2 : (tensor<f32>) -> tensor<1xf32>
    %4 = stablehlo.reshape %3 : (tensor<1xf32>) -> tensor<1x1x1xf32>
    %5 = stablehlo.convert %0 : (tensor<1x64x256xf4E2M1FN>) -> tensor<1x64x256xf32>
    %6 = stablehlo.convert %5 : (tensor<1x64x256xf32>) -> tensor<1x64x256xf8E4M3FN>
    %7 = stablehlo.reshape %6 : (tensor<1x64x256xf8E4M3FN>) -> tensor<1x64x16x16xf8E4M3FN>
    %cst = stablehlo.constant dense<0.000000e+00> : tensor<f8E4M3FN>
    %8 = stablehlo.broadcast_in_dim %cst, dims = [] : (tensor<f8E4M3FN>) -> tensor<1x64x16x16xf8E4M3FN>
    %9 = stablehlo.concatenate %7, %8, dim = 3 : (tensor<1x64x16x16xf8E4M3FN>, tensor<1x64x16x16xf8E4M3FN>) -> tensor<1x64x16x32xf8E4M3FN>
    %10 = stablehlo.reshape %9 : (tensor<1x64x16x32xf8E4M3FN>) -> tensor<1x64x512xf8E4M3FN>
    %11 = stablehlo.convert %1 : (tensor<1x64x16xf8E4M3FN>) -> tensor<1x64x16xf32>
    %12 = stablehlo.broadcast_in_dim %4, dims = [0, 1, 2] : (tensor<1x1x1xf32>) -> tensor<1x64x16xf32>
    %13 = stablehlo.multiply %11, %12 : tensor<1x64x16xf32>
    %c = stablehlo.constant dense<0> : tensor<i32>
    %14 = call @_pad(%13, %c) : (tensor<1x64x16xf32>, tensor<i32>) -> tensor<1x64x16xf32>
    %15 = stablehlo.transpose %14, dims = [0, 2, 1] : (tensor<1x64x16xf32>) -> tensor<1x16x64xf32>
    %16 = stablehlo.reshape %arg3 : (tensor<128x256xf4E2M1FN>) -> tensor<1x128x256xf4E2M1FN>
    %17 = stablehlo.reshape %arg4 : (tensor<128x16xf8E4M3FN>) -> tensor<1x128x16xf8E4M3FN>
    %18 = stablehlo.reshape %arg5 : (tensor<f32>) -> tensor<f32>
    %19 = stablehlo.reshape %18 : (tensor<f32>) -> tensor<1xf32>
    %20 = stablehlo.reshape %19 : (tensor<1xf32>) -> tensor<1x1x1xf32>
    %21 = stablehlo.convert %16 : (tensor<1x128x256xf4E2M1FN>) -> tensor<1x128x256xf32>
    %22 = stablehlo.convert %21 : (tensor<1x128x256xf32>) -> tensor<1x128x256xf8E4M3FN>
    %23 = stablehlo.reshape %22 : (tensor<1x128x256xf8E4M3FN>) -> tensor<1x128x16x16xf8E4M3FN>
    %cst_0 = stablehlo.constant dense<0.000000e+00> : tensor<f8E4M3FN>
    %24 = stablehlo.broadcast_in_dim %cst_0, dims = [] : (tensor<f8E4M3FN>) -> tensor<1x128x16x16xf8E4M3FN>
    %25 = stablehlo.concatenate %23, %24, dim = 3 : (tensor<1x128x16x16xf8E4M3FN>, tensor<1x128x16x16xf8E4M3FN>) -> tensor<1x128x16x32xf8E4M3FN>
    %26 = stablehlo.reshape %25 : (tensor<1x128x16x32xf8E4M3FN>) -> tensor<1x128x512xf8E4M3FN>
    %27 = stablehlo.convert %17 : (tensor<1x128x16xf8E4M3FN>) -> tensor<1x128x16xf32>
    %28 = stablehlo.broadcast_in_dim %20, dims = [0, 1, 2] : (tensor<1x1x1xf32>) -> tensor<1x128x16xf32>
    %29 = stablehlo.multiply %27, %28 : tensor<1x128x16xf32>
    %c_1 = stablehlo.constant dense<0> : tensor<i32>
    %30 = call @_pad_0(%29, %c_1) : (tensor<1x128x16xf32>, tensor<i32>) -> tensor<1x128x16xf32>
    %31 = stablehlo.transpose %30, dims = [0, 2, 1] : (tensor<1x128x16xf32>) -> tensor<1x16x128xf32>
    %32 = stablehlo.custom_call @gpuext_hopper_mx_dot(%10, %26, %15, %31) {backend_config = "", mhlo.backend_config = {config = 1 : i32}, operand_layouts = [dense<[2, 1, 0]> : tensor<3xindex>, dense<[2, 1, 0]> : tensor<3xindex>, dense<[2, 1, 0]> : tensor<3xindex>, dense<[2, 1, 0]> : tensor<3xindex>], result_layouts = [dense<[2, 1, 0]> : tensor<3xindex>]} : (tensor<1x64x512xf8E4M3FN>, tensor<1x128x512xf8E4M3FN>, tensor<1x16x64xf32>, tensor<1x16x128xf32>) -> tensor<1x64x128xf32>
    %33 = stablehlo.reshape %32 : (tensor<1x64x128xf32>) -> tensor<64x128xf32>
    return %33 : tensor<64x128xf32>
  }
  func.func private @_pad(%arg0: tensor<1x64x16xf32>, %arg1: tensor<i32>) -> tensor<1x64x16xf32> {
    %0 = stablehlo.convert %arg1 : (tensor<i32>) -> tensor<f32>
    %1 = stablehlo.pad %arg0, %0, low = [0, 0, 0], high = [0, 0, 0], interior = [0, 0, 0] : (tensor<1x64x16xf32>, tensor<f32>) -> tensor<1x64x16xf32>
    return %1 : tensor<1x64x16xf32>
  }
  func.func private @_pad_0(%arg0: tensor<1x128x16xf32>, %arg1: tensor<i32>) -> tensor<1x128x16xf32> {
    %0 = stablehlo.convert %arg1 : (tensor<i32>) -> tensor<f32>
    %1 = stablehlo.pad %arg0, %0, low = [0, 0, 0], high = [0, 0, 0], interior = [0, 0, 0] : (tensor<1x128x16xf32>, tensor<f32>) -> tensor<1x128x16xf32>
    return %1 : tensor<1x128x16xf32>
  }
}
