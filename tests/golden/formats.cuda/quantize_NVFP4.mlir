// golden lowering: formats.cuda / quantize_NVFP4; jax 0.10.2, jaxlib 0.10.2; python scripts/update_golden.py
module @golden attributes {mhlo.num_partitions = 1 : i32, mhlo.num_replicas = 1 : i32} {
  func.func public @main(%arg0: tensor<256x256xbf16>) -> (tensor<256x256xf4E2M1FN> {jax.result_info = "result[0]"}, tensor<256x16xf8E4M3FN> {jax.result_info = "result[1]"}, tensor<f32> {jax.result_info = "result[2]"}) {
    %0 = stablehlo.bitcast_convert %arg0 : (tensor<256x256xbf16>) -> tensor<256x256xui16>
    %1 = stablehlo.reshape %0 : (tensor<256x256xui16>) -> tensor<65536xui16>
    %c = stablehlo.constant dense<32767> : tensor<ui16>
    %2 = stablehlo.broadcast_in_dim %c, dims = [] : (tensor<ui16>) -> tensor<65536xui16>
    %3 = stablehlo.and %1, %2 : tensor<65536xui16>
    %c_0 = stablehlo.constant dense<32640> : tensor<ui16>
    %4 = stablehlo.broadcast_in_dim %c_0, dims = [] : (tensor<ui16>) -> tensor<65536xui16>
    %5 = stablehlo.compare LT, %3, %4, UNSIGNED : (tensor<65536xui16>, tensor<65536xui16>) -> tensor<65536xi1>
    %c_1 = stablehlo.constant dense<0> : tensor<ui16>
    %6 = call @_where(%5, %3, %c_1) : (tensor<65536xi1>, tensor<65536xui16>, tensor<ui16>) -> tensor<65536xui16>
    %c_2 = stablehlo.constant dense<0> : tensor<i32>
    %7 = call @_pad(%6, %c_2) : (tensor<65536xui16>, tensor<i32>) -> tensor<65536xui16>
    %8 = stablehlo.reshape %7 : (tensor<65536xui16>) -> tensor<8x2048x4xui16>
    %c_3 = stablehlo.constant dense<0> : tensor<ui16>
    %9 = stablehlo.reduce(%8 init: %c_3) applies stablehlo.maximum across dimensions = [1] : (tensor<8x2048x4xui16>, tensor<ui16>) -> tensor<8x4xui16>
    %c_4 = stablehlo.constant dense<0> : tensor<ui16>
    %10 = stablehlo.broadcast_in_dim %c_4, dims = [] : (tensor<ui16>) -> tensor<8x4xui16>
    %11 = stablehlo.maximum %10, %9 : tensor<8x4xui16>
    %12 = stablehlo.reshape %11 : (tensor<8x4xui16>) -> tensor<32xui16>
    %13 = stablehlo.bitcast_convert %12 : (tensor<32xui16>) -> tensor<32xbf16>
    %14 = stablehlo.bitcast_convert %13 : (tensor<32xbf16>) -> tensor<32xui16>
    %15 = stablehlo.convert %14 : (tensor<32xui16>) -> tensor<32xui32>
    %c_5 = stablehlo.constant dense<16> : tensor<ui32>
    %16 = stablehlo.broadcast_in_dim %c_5, dims = [] : (tensor<ui32>) -> tensor<32xui32>
    %17 = stablehlo.shift_left %15, %16 : tensor<32xui32>
    %c_6 = stablehlo.constant dense<0> : tensor<ui32>
    %18 = stablehlo.reduce(%17 init: %c_6) applies stablehlo.maximum across dimensions = [0] : (tensor<32xui32>, tensor<ui32>) -> tensor<ui32>
    %c_7 = stablehlo.constant dense<0> : tensor<ui32>
    %19 = stablehlo.maximum %c_7, %18 : tensor<ui32>
    %c_8 = stablehlo.constant dense<23> : tensor<ui32>
    %20 = stablehlo.shift_right_logical %19, %c_8 : tensor<ui32>
    %c_9 = stablehlo.constant dense<255> : tensor<ui32>
    %21 = stablehlo.and %20, %c_9 : tensor<ui32>
    %22 = stablehlo.convert %21 : (tensor<ui32>) -> tensor<i32>
    %c_10 = stablehlo.constant dense<8388607> : tensor<ui32>
    %23 = stablehlo.and %19, %c_10 : tensor<ui32>
    %c_11 = stablehlo.constant dense<0> : tensor<ui32>
    %24 = stablehlo.shift_left %23, %c_11 : tensor<ui32>
    %c_12 = stablehlo.constant dense<0> : tensor<ui32>
    %25 = stablehlo.compare EQ, %24, %c_12, UNSIGNED : (tensor<ui32>, tensor<ui32>) -> tensor<i1>
    %26 = stablehlo.count_leading_zeros %24 : tensor<ui32>
    %27 = stablehlo.convert %26 : (tensor<ui32>) -> tensor<i32>
    %c_13 = stablehlo.constant dense<8> : tensor<i32>
    %28 = stablehlo.subtract %27, %c_13 : tensor<i32>
    %c_14 = stablehlo.constant dense<0> : tensor<i32>
    %29 = call @_where_0(%25, %c_14, %28) : (tensor<i1>, tensor<i32>, tensor<i32>) -> tensor<i32>
    %c_15 = stablehlo.constant dense<0> : tensor<i32>
    %30 = stablehlo.compare EQ, %22, %c_15, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
    %31 = stablehlo.convert %29 : (tensor<i32>) -> tensor<ui32>
    %32 = stablehlo.shift_left %24, %31 : tensor<ui32>
    %c_16 = stablehlo.constant dense<8388608> : tensor<ui32>
    %33 = stablehlo.or %24, %c_16 : tensor<ui32>
    %34 = call @_where_1(%30, %32, %33) : (tensor<i1>, tensor<ui32>, tensor<ui32>) -> tensor<ui32>
    %35 = stablehlo.convert %34 : (tensor<ui32>) -> tensor<i32>
    %c_17 = stablehlo.constant dense<0> : tensor<i32>
    %36 = stablehlo.compare EQ, %22, %c_17, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
    %c_18 = stablehlo.constant dense<-126> : tensor<i32>
    %37 = stablehlo.subtract %c_18, %29 : tensor<i32>
    %c_19 = stablehlo.constant dense<127> : tensor<i32>
    %38 = stablehlo.subtract %22, %c_19 : tensor<i32>
    %39 = call @_where_2(%36, %37, %38) : (tensor<i1>, tensor<i32>, tensor<i32>) -> tensor<i32>
    %c_20 = stablehlo.constant dense<1160249344> : tensor<ui32>
    %c_21 = stablehlo.constant dense<23> : tensor<ui32>
    %40 = stablehlo.shift_right_logical %c_20, %c_21 : tensor<ui32>
    %c_22 = stablehlo.constant dense<255> : tensor<ui32>
    %41 = stablehlo.and %40, %c_22 : tensor<ui32>
    %42 = stablehlo.convert %41 : (tensor<ui32>) -> tensor<i32>
    %c_23 = stablehlo.constant dense<1160249344> : tensor<ui32>
    %c_24 = stablehlo.constant dense<8388607> : tensor<ui32>
    %43 = stablehlo.and %c_23, %c_24 : tensor<ui32>
    %c_25 = stablehlo.constant dense<0> : tensor<ui32>
    %44 = stablehlo.shift_left %43, %c_25 : tensor<ui32>
    %c_26 = stablehlo.constant dense<0> : tensor<ui32>
    %45 = stablehlo.compare EQ, %44, %c_26, UNSIGNED : (tensor<ui32>, tensor<ui32>) -> tensor<i1>
    %46 = stablehlo.count_leading_zeros %44 : tensor<ui32>
    %47 = stablehlo.convert %46 : (tensor<ui32>) -> tensor<i32>
    %c_27 = stablehlo.constant dense<8> : tensor<i32>
    %48 = stablehlo.subtract %47, %c_27 : tensor<i32>
    %c_28 = stablehlo.constant dense<0> : tensor<i32>
    %49 = call @_where_0(%45, %c_28, %48) : (tensor<i1>, tensor<i32>, tensor<i32>) -> tensor<i32>
    %c_29 = stablehlo.constant dense<0> : tensor<i32>
    %50 = stablehlo.compare EQ, %42, %c_29, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
    %51 = stablehlo.convert %49 : (tensor<i32>) -> tensor<ui32>
    %52 = stablehlo.shift_left %44, %51 : tensor<ui32>
    %c_30 = stablehlo.constant dense<8388608> : tensor<ui32>
    %53 = stablehlo.or %44, %c_30 : tensor<ui32>
    %54 = call @_where_1(%50, %52, %53) : (tensor<i1>, tensor<ui32>, tensor<ui32>) -> tensor<ui32>
    %55 = stablehlo.convert %54 : (tensor<ui32>) -> tensor<i32>
    %c_31 = stablehlo.constant dense<0> : tensor<i32>
    %56 = stablehlo.compare EQ, %42, %c_31, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
    %c_32 = stablehlo.constant dense<-126> : tensor<i32>
    %57 = stablehlo.subtract %c_32, %49 : tensor<i32>
    %c_33 = stablehlo.constant dense<127> : tensor<i32>
    %58 = stablehlo.subtract %42, %c_33 : tensor<i32>
    %59 = call @_where_2(%56, %57, %58) : (tensor<i1>, tensor<i32>, tensor<i32>) -> tensor<i32>
    %60 = stablehlo.convert %35 : (tensor<i32>) -> tensor<ui32>
    %61 = stablehlo.convert %55 : (tensor<i32>) -> tensor<ui32>
    %62 = stablehlo.compare LT, %60, %61, UNSIGNED : (tensor<ui32>, tensor<ui32>) -> tensor<i1>
    %63 = stablehlo.convert %62 : (tensor<i1>) -> tensor<i32>
    %c_34 = stablehlo.constant dense<23> : tensor<i32>
    %64 = stablehlo.add %c_34, %63 : tensor<i32>
    %c_35 = stablehlo.constant dense<8388607> : tensor<ui32>
    %65 = stablehlo.and %60, %c_35 : tensor<ui32>
    %c_36 = stablehlo.constant dense<1065353216> : tensor<ui32>
    %66 = stablehlo.or %65, %c_36 : tensor<ui32>
    %67 = stablehlo.bitcast_convert %66 : (tensor<ui32>) -> tensor<f32>
    %c_37 = stablehlo.constant dense<8388607> : tensor<ui32>
    %68 = stablehlo.and %61, %c_37 : tensor<ui32>
    %c_38 = stablehlo.constant dense<1065353216> : tensor<ui32>
    %69 = stablehlo.or %68, %c_38 : tensor<ui32>
    %70 = stablehlo.bitcast_convert %69 : (tensor<ui32>) -> tensor<f32>
    %71 = stablehlo.divide %67, %70 : tensor<f32>
    %cst = stablehlo.constant dense<0x4B800000> : tensor<f32>
    %cst_39 = stablehlo.constant dense<0x4B000000> : tensor<f32>
    %72 = call @_where_3(%62, %cst, %cst_39) : (tensor<i1>, tensor<f32>, tensor<f32>) -> tensor<f32>
    %73 = stablehlo.multiply %71, %72 : tensor<f32>
    %74 = stablehlo.convert %61 : (tensor<ui32>) -> tensor<f32>
    %cst_40 = stablehlo.constant dense<1.000000e+00> : tensor<f32>
    %75 = stablehlo.divide %cst_40, %74 : tensor<f32>
    %76 = stablehlo.convert %73 : (tensor<f32>) -> tensor<i32>
    %77 = stablehlo.convert %76 : (tensor<i32>) -> tensor<ui32>
    %78 = stablehlo.convert %64 : (tensor<i32>) -> tensor<ui32>
    %79 = stablehlo.shift_left %60, %78 : tensor<ui32>
    %80 = stablehlo.multiply %77, %61 : tensor<ui32>
    %81 = stablehlo.subtract %79, %80 : tensor<ui32>
    %82 = stablehlo.bitcast_convert %81 : (tensor<ui32>) -> tensor<i32>
    %83 = stablehlo.convert %82 : (tensor<i32>) -> tensor<f32>
    %84 = stablehlo.multiply %83, %75 : tensor<f32>
    %85 = stablehlo.floor %84 : tensor<f32>
    %86 = stablehlo.convert %85 : (tensor<f32>) -> tensor<i32>
    %87 = stablehlo.convert %86 : (tensor<i32>) -> tensor<ui32>
    %88 = stablehlo.add %77, %87 : tensor<ui32>
    %89 = stablehlo.multiply %87, %61 : tensor<ui32>
    %90 = stablehlo.subtract %81, %89 : tensor<ui32>
    %91 = stablehlo.bitcast_convert %90 : (tensor<ui32>) -> tensor<i32>
    %c_41 = stablehlo.constant dense<0> : tensor<i32>
    %92 = stablehlo.compare LT, %91, %c_41, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
    %93 = stablehlo.convert %92 : (tensor<i1>) -> tensor<ui32>
    %94 = stablehlo.subtract %88, %93 : tensor<ui32>
    %95 = stablehlo.add %90, %61 : tensor<ui32>
    %96 = call @_where_1(%92, %95, %90) : (tensor<i1>, tensor<ui32>, tensor<ui32>) -> tensor<ui32>
    %97 = stablehlo.compare GE, %96, %61, UNSIGNED : (tensor<ui32>, tensor<ui32>) -> tensor<i1>
    %98 = stablehlo.convert %97 : (tensor<i1>) -> tensor<ui32>
    %99 = stablehlo.add %94, %98 : tensor<ui32>
    %100 = stablehlo.subtract %96, %61 : tensor<ui32>
    %101 = call @_where_1(%97, %100, %96) : (tensor<i1>, tensor<ui32>, tensor<ui32>) -> tensor<ui32>
    %102 = stablehlo.subtract %39, %59 : tensor<i32>
    %103 = stablehlo.convert %62 : (tensor<i1>) -> tensor<i32>
    %104 = stablehlo.subtract %102, %103 : tensor<i32>
    %c_42 = stablehlo.constant dense<1> : tensor<ui32>
    %105 = stablehlo.shift_left %101, %c_42 : tensor<ui32>
    %106 = stablehlo.compare GT, %105, %61, UNSIGNED : (tensor<ui32>, tensor<ui32>) -> tensor<i1>
    %107 = stablehlo.compare EQ, %105, %61, UNSIGNED : (tensor<ui32>, tensor<ui32>) -> tensor<i1>
    %c_43 = stablehlo.constant dense<1> : tensor<ui32>
    %108 = stablehlo.and %99, %c_43 : tensor<ui32>
    %c_44 = stablehlo.constant dense<1> : tensor<ui32>
    %109 = stablehlo.compare EQ, %108, %c_44, UNSIGNED : (tensor<ui32>, tensor<ui32>) -> tensor<i1>
    %110 = stablehlo.and %107, %109 : tensor<i1>
    %111 = stablehlo.or %106, %110 : tensor<i1>
    %112 = stablehlo.convert %111 : (tensor<i1>) -> tensor<ui32>
    %113 = stablehlo.add %99, %112 : tensor<ui32>
    %c_45 = stablehlo.constant dense<24> : tensor<ui32>
    %114 = stablehlo.shift_right_logical %113, %c_45 : tensor<ui32>
    %115 = stablehlo.convert %114 : (tensor<ui32>) -> tensor<i32>
    %116 = stablehlo.add %104, %115 : tensor<i32>
    %117 = stablehlo.convert %115 : (tensor<i32>) -> tensor<ui32>
    %118 = stablehlo.shift_right_logical %113, %117 : tensor<ui32>
    %119 = stablehlo.convert %118 : (tensor<ui32>) -> tensor<i32>
    %c_46 = stablehlo.constant dense<-126> : tensor<i32>
    %120 = stablehlo.compare LT, %116, %c_46, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
    %c_47 = stablehlo.constant dense<-126> : tensor<i32>
    %121 = call @_where_0(%120, %c_47, %116) : (tensor<i1>, tensor<i32>, tensor<i32>) -> tensor<i32>
    %c_48 = stablehlo.constant dense<8388608> : tensor<i32>
    %122 = call @_where_0(%120, %c_48, %119) : (tensor<i1>, tensor<i32>, tensor<i32>) -> tensor<i32>
    %c_49 = stablehlo.constant dense<0> : tensor<ui32>
    %123 = stablehlo.compare EQ, %19, %c_49, UNSIGNED : (tensor<ui32>, tensor<ui32>) -> tensor<i1>
    %c_50 = stablehlo.constant dense<127> : tensor<i32>
    %124 = stablehlo.add %121, %c_50 : tensor<i32>
    %125 = stablehlo.convert %124 : (tensor<i32>) -> tensor<ui32>
    %c_51 = stablehlo.constant dense<23> : tensor<ui32>
    %126 = stablehlo.shift_left %125, %c_51 : tensor<ui32>
    %127 = stablehlo.convert %122 : (tensor<i32>) -> tensor<ui32>
    %c_52 = stablehlo.constant dense<8388607> : tensor<ui32>
    %128 = stablehlo.and %127, %c_52 : tensor<ui32>
    %129 = stablehlo.or %126, %128 : tensor<ui32>
    %c_53 = stablehlo.constant dense<1065353216> : tensor<ui32>
    %130 = call @_where_1(%123, %c_53, %129) : (tensor<i1>, tensor<ui32>, tensor<ui32>) -> tensor<ui32>
    %131 = stablehlo.bitcast_convert %130 : (tensor<ui32>) -> tensor<f32>
    %132:2 = stablehlo.custom_call @gpuext_quantize(%arg0, %131) {backend_config = "", mhlo.backend_config = {axis = -1 : i64, format = 2 : i32, fp4_packed = 1 : i32, scale_rounding = 2 : i32}, operand_layouts = [dense<[1, 0]> : tensor<2xindex>, dense<> : tensor<0xindex>], result_layouts = [dense<[1, 0]> : tensor<2xindex>, dense<[1, 0]> : tensor<2xindex>]} : (tensor<256x256xbf16>, tensor<f32>) -> (tensor<256x256xf4E2M1FN>, tensor<256x16xf8E4M3FN>)
    return %132#0, %132#1, %131 : tensor<256x256xf4E2M1FN>, tensor<256x16xf8E4M3FN>, tensor<f32>
  }
  func.func private @_where(%arg0: tensor<65536xi1>, %arg1: tensor<65536xui16>, %arg2: tensor<ui16>) -> tensor<65536xui16> {
    %0 = stablehlo.broadcast_in_dim %arg2, dims = [] : (tensor<ui16>) -> tensor<65536xui16>
    %1 = stablehlo.select %arg0, %arg1, %0 : tensor<65536xi1>, tensor<65536xui16>
    return %1 : tensor<65536xui16>
  }
  func.func private @_pad(%arg0: tensor<65536xui16>, %arg1: tensor<i32>) -> tensor<65536xui16> {
    %0 = stablehlo.convert %arg1 : (tensor<i32>) -> tensor<ui16>
    %1 = stablehlo.pad %arg0, %0, low = [0], high = [0], interior = [0] : (tensor<65536xui16>, tensor<ui16>) -> tensor<65536xui16>
    return %1 : tensor<65536xui16>
  }
  func.func private @_where_0(%arg0: tensor<i1>, %arg1: tensor<i32>, %arg2: tensor<i32>) -> tensor<i32> {
    %0 = stablehlo.convert %arg1 : tensor<i32>
    %1 = stablehlo.select %arg0, %0, %arg2 : tensor<i1>, tensor<i32>
    return %1 : tensor<i32>
  }
  func.func private @_where_1(%arg0: tensor<i1>, %arg1: tensor<ui32>, %arg2: tensor<ui32>) -> tensor<ui32> {
    %0 = stablehlo.select %arg0, %arg1, %arg2 : tensor<i1>, tensor<ui32>
    return %0 : tensor<ui32>
  }
  func.func private @_where_2(%arg0: tensor<i1>, %arg1: tensor<i32>, %arg2: tensor<i32>) -> tensor<i32> {
    %0 = stablehlo.select %arg0, %arg1, %arg2 : tensor<i1>, tensor<i32>
    return %0 : tensor<i32>
  }
  func.func private @_where_3(%arg0: tensor<i1>, %arg1: tensor<f32>, %arg2: tensor<f32>) -> tensor<f32> {
    %0 = stablehlo.select %arg0, %arg1, %arg2 : tensor<i1>, tensor<f32>
    return %0 : tensor<f32>
  }
}
