// golden lowering: block_scaled_dot.hopper_mx / mxfp8_e4m3_e5m2; jax 0.10.2, jaxlib 0.10.2; python scripts/update_golden.py
module @golden attributes {mhlo.num_partitions = 1 : i32, mhlo.num_replicas = 1 : i32} {
  func.func public @main(%arg0: tensor<64x256xf8E4M3FN>, %arg1: tensor<64x8xf8E8M0FNU>, %arg2: tensor<128x256xf8E5M2>, %arg3: tensor<128x8xf8E8M0FNU>) -> (tensor<64x128xbf16> {jax.result_info = "result"}) {
    %0 = stablehlo.reshape %arg0 : (tensor<64x256xf8E4M3FN>) -> tensor<1x64x256xf8E4M3FN>
    %1 = stablehlo.reshape %arg1 : (tensor<64x8xf8E8M0FNU>) -> tensor<1x64x8xf8E8M0FNU>
    %2 = stablehlo.bitcast_convert %1 : (tensor<1x64x8xf8E8M0FNU>) -> tensor<1x64x8xui8>
    %3 = stablehlo.convert %2 : (tensor<1x64x8xui8>) -> tensor<1x64x8xui32>
    %c = stablehlo.constant dense<0> : tensor<ui32>
    %4 = stablehlo.broadcast_in_dim %c, dims = [] : (tensor<ui32>) -> tensor<1x64x8xui32>
    %5 = stablehlo.compare EQ, %3, %4, UNSIGNED : (tensor<1x64x8xui32>, tensor<1x64x8xui32>) -> tensor<1x64x8xi1>
    %c_0 = stablehlo.constant dense<23> : tensor<ui32>
    %6 = stablehlo.broadcast_in_dim %c_0, dims = [] : (tensor<ui32>) -> tensor<1x64x8xui32>
    %7 = stablehlo.shift_left %3, %6 : tensor<1x64x8xui32>
    %c_1 = stablehlo.constant dense<4194304> : tensor<ui32>
    %8 = call @_where(%5, %c_1, %7) : (tensor<1x64x8xi1>, tensor<ui32>, tensor<1x64x8xui32>) -> tensor<1x64x8xui32>
    %c_2 = stablehlo.constant dense<255> : tensor<ui32>
    %9 = stablehlo.broadcast_in_dim %c_2, dims = [] : (tensor<ui32>) -> tensor<1x64x8xui32>
    %10 = stablehlo.compare EQ, %3, %9, UNSIGNED : (tensor<1x64x8xui32>, tensor<1x64x8xui32>) -> tensor<1x64x8xi1>
    %c_3 = stablehlo.constant dense<2143289344> : tensor<ui32>
    %11 = call @_where(%10, %c_3, %8) : (tensor<1x64x8xi1>, tensor<ui32>, tensor<1x64x8xui32>) -> tensor<1x64x8xui32>
    %12 = stablehlo.bitcast_convert %11 : (tensor<1x64x8xui32>) -> tensor<1x64x8xf32>
    %c_4 = stablehlo.constant dense<0> : tensor<i32>
    %13 = call @_pad(%12, %c_4) : (tensor<1x64x8xf32>, tensor<i32>) -> tensor<1x64x8xf32>
    %14 = stablehlo.transpose %13, dims = [0, 2, 1] : (tensor<1x64x8xf32>) -> tensor<1x8x64xf32>
    %15 = stablehlo.reshape %arg2 : (tensor<128x256xf8E5M2>) -> tensor<1x128x256xf8E5M2>
    %16 = stablehlo.reshape %arg3 : (tensor<128x8xf8E8M0FNU>) -> tensor<1x128x8xf8E8M0FNU>
    %17 = stablehlo.bitcast_convert %16 : (tensor<1x128x8xf8E8M0FNU>) -> tensor<1x128x8xui8>
    %18 = stablehlo.convert %17 : (tensor<1x128x8xui8>) -> tensor<1x128x8xui32>
    %c_5 = stablehlo.constant dense<0> : tensor<ui32>
    %19 = stablehlo.broadcast_in_dim %c_5, dims = [] : (tensor<ui32>) -> tensor<1x128x8xui32>
    %20 = stablehlo.compare EQ, %18, %19, UNSIGNED : (tensor<1x128x8xui32>, tensor<1x128x8xui32>) -> tensor<1x128x8xi1>
    %c_6 = stablehlo.constant dense<23> : tensor<ui32>
    %21 = stablehlo.broadcast_in_dim %c_6, dims = [] : (tensor<ui32>) -> tensor<1x128x8xui32>
    %22 = stablehlo.shift_left %18, %21 : tensor<1x128x8xui32>
    %c_7 = stablehlo.constant dense<4194304> : tensor<ui32>
    %23 = call @_where_0(%20, %c_7, %22) : (tensor<1x128x8xi1>, tensor<ui32>, tensor<1x128x8xui32>) -> tensor<1x128x8xui32>
    %c_8 = stablehlo.constant dense<255> : tensor<ui32>
    %24 = stablehlo.broadcast_in_dim %c_8, dims = [] : (tensor<ui32>) -> tensor<1x128x8xui32>
    %25 = stablehlo.compare EQ, %18, %24, UNSIGNED : (tensor<1x128x8xui32>, tensor<1x128x8xui32>) -> tensor<1x128x8xi1>
    %c_9 = stablehlo.constant dense<2143289344> : tensor<ui32>
    %26 = call @_where_0(%25, %c_9, %23) : (tensor<1x128x8xi1>, tensor<ui32>, tensor<1x128x8xui32>) -> tensor<1x128x8xui32>
    %27 = stablehlo.bitcast_convert %26 : (tensor<1x128x8xui32>) -> tensor<1x128x8xf32>
    %c_10 = stablehlo.constant dense<0> : tensor<i32>
    %28 = call @_pad_1(%27, %c_10) : (tensor<1x128x8xf32>, tensor<i32>) -> tensor<1x128x8xf32>
    %29 = stablehlo.transpose %28, dims = [0, 2, 1] : (tensor<1x128x8xf32>) -> tensor<1x8x128xf32>
    %30 = stablehlo.custom_call @gpuext_hopper_mx_dot(%0, %15, %14, %29) {backend_config = "", mhlo.backend_config = {config = 1 : i32}, operand_layouts = [dense<[2, 1, 0]> : tensor<3xindex>, dense<[2, 1, 0]> : tensor<3xindex>, dense<[2, 1, 0]> : tensor<3xindex>, dense<[2, 1, 0]> : tensor<3xindex>], result_layouts = [dense<[2, 1, 0]> : tensor<3xindex>]} : (tensor<1x64x256xf8E4M3FN>, tensor<1x128x256xf8E5M2>, tensor<1x8x64xf32>, tensor<1x8x128xf32>) -> tensor<1x64x128xbf16>
    %31 = stablehlo.reshape %30 : (tensor<1x64x128xbf16>) -> tensor<64x128xbf16>
    return %31 : tensor<64x128xbf16>
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
