// golden lowering: block_scaled_dot.hopper_mx / mxfp4; jax 0.10.2, jaxlib 0.10.2; python scripts/update_golden.py
module @golden attributes {mhlo.num_partitions = 1 : i32, mhlo.num_replicas = 1 : i32} {
  func.func public @main(%arg0: tensor<64x256xf4E2M1FN>, %arg1: tensor<64x8xf8E8M0FNU>, %arg2: tensor<128x256xf8E4M3FN>, %arg3: tensor<128x8xf8E8M0FNU>) -> (tensor<64x128xf32> {jax.result_info = "result"}) {
    %0 = stablehlo.reshape %arg0 : (tensor<64x256xf4E2M1FN>) -> tensor<1x64x256xf4E2M1FN>
    %1 = stablehlo.reshape %arg1 : (tensor<64x8xf8E8M0FNU>) -> tensor<1x64x8xf8E8M0FNU>
    %2 = stablehlo.convert %0 : (tensor<1x64x256xf4E2M1FN>) -> tensor<1x64x256xf32>
    %3 = stablehlo.convert %2 : (tensor<1x64x256xf32>) -> tensor<1x64x256xf8E4M3FN>
    %4 = stablehlo.bitcast_convert %1 : (tensor<1x64x8xf8E8M0FNU>) -> tensor<1x64x8xui8>
    %5 = stablehlo.convert %4 : (tensor<1x64x8xui8>) -> tensor<1x64x8xui32>
    %c = stablehlo.constant dense<0> : tensor<ui32>
    %6 = stablehlo.broadcast_in_dim %c, dims = [] : (tensor<ui32>) -> tensor<1x64x8xui32>
    %7 = stablehlo.compare EQ, %5, %6, UNSIGNED : (tensor<1x64x8xui32>, tensor<1x64x8xui32>) -> tensor<1x64x8xi1>
    %c_0 = stablehlo.constant dense<23> : tensor<ui32>
    %8 = stablehlo.broadcast_in_dim %c_0, dims = [] : (tensor<ui32>) -> tensor<1x64x8xui32>
    %9 = stablehlo.shift_left %5, %8 : tensor<1x64x8xui32>
    %c_1 = stablehlo.constant dense<4194304> : tensor<ui32>
    %10 = call @_where(%7, %c_1, %9) : (tensor<1x64x8xi1>, tensor<ui32>, tensor<1x64x8xui32>) -> tensor<1x64x8xui32>
    %c_2 = stablehlo.constant dense<255> : tensor<ui32>
    %11 = stablehlo.broadcast_in_dim %c_2, dims = [] : (tensor<ui32>) -> tensor<1x64x8xui32>
    %12 = stablehlo.compare EQ, %5, %11, UNSIGNED : (tensor<1x64x8xui32>, tensor<1x64x8xui32>) -> tensor<1x64x8xi1>
    %c_3 = stablehlo.constant dense<2143289344> : tensor<ui32>
    %13 = call @_where(%12, %c_3, %10) : (tensor<1x64x8xi1>, tensor<ui32>, tensor<1x64x8xui32>) -> tensor<1x64x8xui32>
    %14 = stablehlo.bitcast_convert %13 : (tensor<1x64x8xui32>) -> tensor<1x64x8xf32>
    %c_4 = stablehlo.constant dense<0> : tensor<i32>
    %15 = call @_pad(%14, %c_4) : (tensor<1x64x8xf32>, tensor<i32>) -> tensor<1x64x8xf32>
    %16 = stablehlo.transpose %15, dims = [0, 2, 1] : (tensor<1x64x8xf32>) -> tensor<1x8x64xf32>
    %17 = stablehlo.reshape %arg2 : (tensor<128x256xf8E4M3FN>) -> tensor<1x128x256xf8E4M3FN>
    %18 = stablehlo.reshape %arg3 : (tensor<128x8xf8E8M0FNU>) -> tensor<1x128x8xf8E8M0FNU>
    %19 = stablehlo.bitcast_convert %18 : (tensor<1x128x8xf8E8M0FNU>) -> tensor<1x128x8xui8>
    %20 = stablehlo.convert %19 : (tensor<1x128x8xui8>) -> tensor<1x128x8xui32>
    %c_5 = stablehlo.constant dense<0> : tensor<ui32>
    %21 = stablehlo.broadcast_in_dim %c_5, dims = [] : (tensor<ui32>) -> tensor<1x128x8xui32>
    %22 = stablehlo.compare EQ, %20, %21, UNSIGNED : (tensor<1x128x8xui32>, tensor<1x128x8xui32>) -> tensor<1x128x8xi1>
    %c_6 = stablehlo.constant dense<23> : tensor<ui32>
    %23 = stablehlo.broadcast_in_dim %c_6, dims = [] : (tensor<ui32>) -> tensor<1x128x8xui32>
    %24 = stablehlo.shift_left %20, %23 : tensor<1x128x8xui32>
    %c_7 = stablehlo.constant dense<4194304> : tensor<ui32>
    %25 = call @_where_0(%22, %c_7, %24) : (tensor<1x128x8xi1>, tensor<ui32>, tensor<1x128x8xui32>) -> tensor<1x128x8xui32>
    %c_8 = stablehlo.constant dense<255> : tensor<ui32>
    %26 = stablehlo.broadcast_in_dim %c_8, dims = [] : (tensor<ui32>) -> tensor<1x128x8xui32>
    %27 = stablehlo.compare EQ, %20, %26, UNSIGNED : (tensor<1x128x8xui32>, tensor<1x128x8xui32>) -> tensor<1x128x8xi1>
    %c_9 = stablehlo.constant dense<2143289344> : tensor<ui32>
    %28 = call @_where_0(%27, %c_9, %25) : (tensor<1x128x8xi1>, tensor<ui32>, tensor<1x128x8xui32>) -> tensor<1x128x8xui32>
    %29 = stablehlo.bitcast_convert %28 : (tensor<1x128x8xui32>) -> tensor<1x128x8xf32>
    %c_10 = stablehlo.constant dense<0> : tensor<i32>
    %30 = call @_pad_1(%29, %c_10) : (tensor<1x128x8xf32>, tensor<i32>) -> tensor<1x128x8xf32>
    %31 = stablehlo.transpose %30, dims = [0, 2, 1] : (tensor<1x128x8xf32>) -> tensor<1x8x128xf32>
    %32 = stablehlo.custom_call @gpuext_hopper_mx_dot(%3, %17, %16, %31) {backend_config = "", mhlo.backend_config = {config = 1 : i32}, operand_layouts = [dense<[2, 1, 0]> : tensor<3xindex>, dense<[2, 1, 0]> : tensor<3xindex>, dense<[2, 1, 0]> : tensor<3xindex>, dense<[2, 1, 0]> : tensor<3xindex>], result_layouts = [dense<[2, 1, 0]> : tensor<3xindex>]} : (tensor<1x64x256xf8E4M3FN>, tensor<1x128x256xf8E4M3FN>, tensor<1x8x64xf32>, tensor<1x8x128xf32>) -> tensor<1x64x128xf32>
    %33 = stablehlo.reshape %32 : (tensor<1x64x128xf32>) -> tensor<64x128xf32>
    return %33 : tensor<64x128xf32>
  }
  func.func private @_where(%arg0: tensor<1x64x8xi1>, %arg1: tensor<ui32>, %arg2: tensor<1x64x8xui32>) -> tensor<1x64x8xui32> {
    %0 = stablehlo.broadcast_in_dim %arg1, dims = [] : (tensor<ui32>) -> tensor<1x64x8xui32>
    %1 = stablehlo.select %arg0, %0, %arg2 : tensor<1x64x8xi1>, tensor<1x64x8xui32>
    return %1 : tensor<1x64x8xui32>
  }
  func.func private @_pad(%arg0: tensor<1x64x8xf32>, %arg1: tensor<i32>) -> tensor<1x64x8xf32> {
    %0 = stablehlo.convert %arg1 : (tensor<i32>) -> tensor<f32>
    %1 = stablehlo.pad %arg0, %0, low = [0, 0, 0], high = [0, 0, 0], interior = [0, 0, 0] : (tensor<1x64x8xf32>, tensor<f32>) -> tensor<1x64x8xf32>
    return %1 : tensor<1x64x8xf32>
  }
  func.func private @_where_0(%arg0: tensor<1x128x8xi1>, %arg1: tensor<ui32>, %arg2: tensor<1x128x8xui32>) -> tensor<1x128x8xui32> {
    %0 = stablehlo.broadcast_in_dim %arg1, dims = [] : (tensor<ui32>) -> tensor<1x128x8xui32>
    %1 = stablehlo.select %arg0, %0, %arg2 : tensor<1x128x8xi1>, tensor<1x128x8xui32>
    return %1 : tensor<1x128x8xui32>
  }
  func.func private @_pad_1(%arg0: tensor<1x128x8xf32>, %arg1: tensor<i32>) -> tensor<1x128x8xf32> {
    %0 = stablehlo.convert %arg1 : (tensor<i32>) -> tensor<f32>
    %1 = stablehlo.pad %arg0, %0, low = [0, 0, 0], high = [0, 0, 0], interior = [0, 0, 0] : (tensor<1x128x8xf32>, tensor<f32>) -> tensor<1x128x8xf32>
    return %1 : tensor<1x128x8xf32>
  }
}
