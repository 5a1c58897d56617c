// golden lowering: formats.cuda / token_slots; jax 0.10.2, jaxlib 0.10.2; python scripts/update_golden.py
module @golden attributes {mhlo.num_partitions = 1 : i32, mhlo.num_replicas = 1 : i32} {
  func.func public @main(%arg0: tensor<300x264xbf16>, %arg1: tensor<5xi32>) -> (tensor<264x300xf8E4M3FN> {jax.result_info = "result[0]"}, tensor<264x8xf32> {jax.result_info = "result[1]"}, tensor<264x1024xf8E4M3FN> {jax.result_info = "result[3]"}) {
    %c = stablehlo.constant dense<0> : tensor<i32>
    %c_0 = stablehlo.constant dense<300> : tensor<i32>
    %0 = call @clip(%arg1, %c, %c_0) : (tensor<5xi32>, tensor<i32>, tensor<i32>) -> tensor<5xi32>
    %1 = stablehlo.slice %0 [0:4:2] : (tensor<5xi32>) -> tensor<2xi32>
    %2 = stablehlo.slice %0 [1:5:2] : (tensor<5xi32>) -> tensor<2xi32>
    %3 = stablehlo.add %1, %2 : tensor<2xi32>
    %c_1 = stablehlo.constant dense<300> : tensor<i32>
    %4 = stablehlo.broadcast_in_dim %c_1, dims = [] : (tensor<i32>) -> tensor<2xi32>
    %5 = stablehlo.minimum %3, %4 : tensor<2xi32>
    %6 = stablehlo.slice %5 [0:1:2] : (tensor<2xi32>) -> tensor<1xi32>
    %7 = stablehlo.slice %5 [1:2:2] : (tensor<2xi32>) -> tensor<1xi32>
    %8 = stablehlo.add %6, %7 : tensor<1xi32>
    %c_2 = stablehlo.constant dense<300> : tensor<i32>
    %9 = stablehlo.broadcast_in_dim %c_2, dims = [] : (tensor<i32>) -> tensor<1xi32>
    %10 = stablehlo.minimum %8, %9 : tensor<1xi32>
    %11 = stablehlo.slice %10 [0:0] : (tensor<1xi32>) -> tensor<0xi32>
    %12 = stablehlo.slice %5 [2:2:2] : (tensor<2xi32>) -> tensor<0xi32>
    %13 = stablehlo.add %11, %12 : tensor<0xi32>
    %c_3 = stablehlo.constant dense<300> : tensor<i32>
    %14 = stablehlo.broadcast_in_dim %c_3, dims = [] : (tensor<i32>) -> tensor<0xi32>
    %15 = stablehlo.minimum %13, %14 : tensor<0xi32>
    %16 = stablehlo.slice %5 [0:1] : (tensor<2xi32>) -> tensor<1xi32>
    %17 = stablehlo.concatenate %16, %15, dim = 0 : (tensor<1xi32>, tensor<0xi32>) -> tensor<1xi32>
    %c_4 = stablehlo.constant dense<0> : tensor<i32>
    %18 = stablehlo.pad %17, %c_4, low = [0], high = [1], interior = [1] : (tensor<1xi32>, tensor<i32>) -> tensor<2xi32>
    %c_5 = stablehlo.constant dense<0> : tensor<i32>
    %19 = stablehlo.pad %10, %c_5, low = [1], high = [0], interior = [1] : (tensor<1xi32>, tensor<i32>) -> tensor<2xi32>
    %20 = stablehlo.add %18, %19 : tensor<2xi32>
    %21 = stablehlo.slice %0 [2:5:2] : (tensor<5xi32>) -> tensor<2xi32>
    %22 = stablehlo.add %20, %21 : tensor<2xi32>
    %c_6 = stablehlo.constant dense<300> : tensor<i32>
    %23 = stablehlo.broadcast_in_dim %c_6, dims = [] : (tensor<i32>) -> tensor<2xi32>
    %24 = stablehlo.minimum %22, %23 : tensor<2xi32>
    %25 = stablehlo.slice %0 [0:1] : (tensor<5xi32>) -> tensor<1xi32>
    %26 = stablehlo.concatenate %25, %24, dim = 0 : (tensor<1xi32>, tensor<2xi32>) -> tensor<3xi32>
    %c_7 = stablehlo.constant dense<0> : tensor<i32>
    %27 = stablehlo.pad %26, %c_7, low = [0], high = [0], interior = [1] : (tensor<3xi32>, tensor<i32>) -> tensor<5xi32>
    %c_8 = stablehlo.constant dense<0> : tensor<i32>
    %28 = stablehlo.pad %20, %c_8, low = [1], high = [1], interior = [1] : (tensor<2xi32>, tensor<i32>) -> tensor<5xi32>
    %29 = stablehlo.add %27, %28 : tensor<5xi32>
    %c_9 = stablehlo.constant dense<300> : tensor<i32>
    %30 = stablehlo.broadcast_in_dim %c_9, dims = [] : (tensor<i32>) -> tensor<1xi32>
    %31 = stablehlo.concatenate %29, %30, dim = 0 : (tensor<5xi32>, tensor<1xi32>) -> tensor<6xi32>
    %c_10 = stablehlo.constant dense<0> : tensor<i32>
    %32 = stablehlo.broadcast_in_dim %c_10, dims = [] : (tensor<i32>) -> tensor<1xi32>
    %33 = stablehlo.concatenate %32, %29, dim = 0 : (tensor<1xi32>, tensor<5xi32>) -> tensor<6xi32>
    %34 = stablehlo.subtract %31, %33 : tensor<6xi32>
    %c_11 = stablehlo.constant dense<127> : tensor<i32>
    %35 = stablehlo.broadcast_in_dim %c_11, dims = [] : (tensor<i32>) -> tensor<6xi32>
    %36 = stablehlo.add %34, %35 : tensor<6xi32>
    %c_12 = stablehlo.constant dense<128> : tensor<i32>
    %37 = call @floor_divide(%36, %c_12) : (tensor<6xi32>, tensor<i32>) -> tensor<6xi32>
    %38 = call @cumsum(%37) : (tensor<6xi32>) -> tensor<6xi32>
    %39 = stablehlo.subtract %38, %37 : tensor<6xi32>
    %40 = stablehlo.iota dim = 0 : tensor<8xi32>
    %c_13 = stablehlo.constant dense<0> : tensor<i32>
    %c_14 = stablehlo.constant dense<8> : tensor<i32>
    %41 = call @clip_1(%38, %c_13, %c_14) : (tensor<6xi32>, tensor<i32>, tensor<i32>) -> tensor<6xi32>
    %c_15 = stablehlo.constant dense<0> : tensor<i32>
    %42 = stablehlo.broadcast_in_dim %c_15, dims = [] : (tensor<i32>) -> tensor<9xi32>
    %c_16 = stablehlo.constant dense<1> : tensor<i32>
    %43 = stablehlo.broadcast_in_dim %c_16, dims = [] : (tensor<i32>) -> tensor<6xi32>
    %c_17 = stablehlo.constant dense<0> : tensor<i32>
    %44 = stablehlo.broadcast_in_dim %c_17, dims = [] : (tensor<i32>) -> tensor<6xi32>
    %45 = stablehlo.compare LT, %41, %44, SIGNED : (tensor<6xi32>, tensor<6xi32>) -> tensor<6xi1>
    %c_18 = stablehlo.constant dense<9> : tensor<i32>
    %46 = stablehlo.broadcast_in_dim %c_18, dims = [] : (tensor<i32>) -> tensor<6xi32>
    %47 = stablehlo.add %41, %46 : tensor<6xi32>
    %48 = stablehlo.select %45, %47, %41 : tensor<6xi1>, tensor<6xi32>
    %49 = stablehlo.broadcast_in_dim %48, dims = [0] : (tensor<6xi32>) -> tensor<6x1xi32>
    %50 = "stablehlo.scatter"(%42, %49, %43) <{indices_are_sorted = false, scatter_dimension_numbers = #stablehlo.scatter<inserted_window_dims = [0], scatter_dims_to_operand_dims = [0], index_vector_dim = 1>, unique_indices = false}> ({
    ^bb0(%arg2: tensor<i32>, %arg3: tensor<i32>):
      %177 = stablehlo.add %arg2, %arg3 : tensor<i32>
      stablehlo.return %177 : tensor<i32>
    }) : (tensor<9xi32>, tensor<6x1xi32>, tensor<6xi32>) -> tensor<9xi32>
    %51 = stablehlo.slice %50 [0:8] : (tensor<9xi32>) -> tensor<8xi32>
    %52 = call @cumsum_2(%51) : (tensor<8xi32>) -> tensor<8xi32>
    %c_19 = stablehlo.constant dense<6> : tensor<i32>
    %53 = stablehlo.broadcast_in_dim %c_19, dims = [] : (tensor<i32>) -> tensor<8xi32>
    %54 = stablehlo.compare LT, %52, %53, SIGNED : (tensor<8xi32>, tensor<8xi32>) -> tensor<8xi1>
    %c_20 = stablehlo.constant dense<5> : tensor<i32>
    %55 = stablehlo.broadcast_in_dim %c_20, dims = [] : (tensor<i32>) -> tensor<8xi32>
    %56 = stablehlo.minimum %52, %55 : tensor<8xi32>
    %c_21 = stablehlo.constant dense<0> : tensor<i32>
    %57 = stablehlo.broadcast_in_dim %c_21, dims = [] : (tensor<i32>) -> tensor<8xi32>
    %58 = stablehlo.compare LT, %56, %57, SIGNED : (tensor<8xi32>, tensor<8xi32>) -> tensor<8xi1>
    %c_22 = stablehlo.constant dense<6> : tensor<i32>
    %59 = stablehlo.broadcast_in_dim %c_22, dims = [] : (tensor<i32>) -> tensor<8xi32>
    %60 = stablehlo.add %56, %59 : tensor<8xi32>
    %61 = stablehlo.select %58, %60, %56 : tensor<8xi1>, tensor<8xi32>
    %62 = stablehlo.broadcast_in_dim %61, dims = [0] : (tensor<8xi32>) -> tensor<8x1xi32>
    %63 = "stablehlo.gather"(%39, %62) <{dimension_numbers = #stablehlo.gather<collapsed_slice_dims = [0], start_index_map = [0], index_vector_dim = 1>, indices_are_sorted = false, slice_sizes = array<i64: 1>}> : (tensor<6xi32>, tensor<8x1xi32>) -> tensor<8xi32>
    %64 = stablehlo.subtract %40, %63 : tensor<8xi32>
    %c_23 = stablehlo.constant dense<128> : tensor<i32>
    %65 = stablehlo.broadcast_in_dim %c_23, dims = [] : (tensor<i32>) -> tensor<8xi32>
    %66 = stablehlo.multiply %64, %65 : tensor<8xi32>
    %c_24 = stablehlo.constant dense<0> : tensor<i32>
    %67 = stablehlo.broadcast_in_dim %c_24, dims = [] : (tensor<i32>) -> tensor<8xi32>
    %68 = stablehlo.compare LT, %56, %67, SIGNED : (tensor<8xi32>, tensor<8xi32>) -> tensor<8xi1>
    %c_25 = stablehlo.constant dense<6> : tensor<i32>
    %69 = stablehlo.broadcast_in_dim %c_25, dims = [] : (tensor<i32>) -> tensor<8xi32>
    %70 = stablehlo.add %56, %69 : tensor<8xi32>
    %71 = stablehlo.select %68, %70, %56 : tensor<8xi1>, tensor<8xi32>
    %72 = stablehlo.broadcast_in_dim %71, dims = [0] : (tensor<8xi32>) -> tensor<8x1xi32>
    %73 = "stablehlo.gather"(%34, %72) <{dimension_numbers = #stablehlo.gather<collapsed_slice_dims = [0], start_index_map = [0], index_vector_dim = 1>, indices_are_sorted = false, slice_sizes = array<i64: 1>}> : (tensor<6xi32>, tensor<8x1xi32>) -> tensor<8xi32>
    %74 = stablehlo.subtract %73, %66 : tensor<8xi32>
    %c_26 = stablehlo.constant dense<0> : tensor<i32>
    %c_27 = stablehlo.constant dense<128> : tensor<i32>
    %75 = call @clip_4(%74, %c_26, %c_27) : (tensor<8xi32>, tensor<i32>, tensor<i32>) -> tensor<8xi32>
    %c_28 = stablehlo.constant dense<0> : tensor<i32>
    %76 = call @_where_5(%54, %75, %c_28) : (tensor<8xi1>, tensor<8xi32>, tensor<i32>) -> tensor<8xi32>
    %c_29 = stablehlo.constant dense<0> : tensor<i32>
    %77 = stablehlo.broadcast_in_dim %c_29, dims = [] : (tensor<i32>) -> tensor<8xi32>
    %78 = stablehlo.compare GT, %76, %77, SIGNED : (tensor<8xi32>, tensor<8xi32>) -> tensor<8xi1>
    %c_30 = stablehlo.constant dense<0> : tensor<i32>
    %79 = stablehlo.broadcast_in_dim %c_30, dims = [] : (tensor<i32>) -> tensor<8xi32>
    %80 = stablehlo.compare LT, %56, %79, SIGNED : (tensor<8xi32>, tensor<8xi32>) -> tensor<8xi1>
    %c_31 = stablehlo.constant dense<6> : tensor<i32>
    %81 = stablehlo.broadcast_in_dim %c_31, dims = [] : (tensor<i32>) -> tensor<8xi32>
    %82 = stablehlo.add %56, %81 : tensor<8xi32>
    %83 = stablehlo.select %80, %82, %56 : tensor<8xi1>, tensor<8xi32>
    %84 = stablehlo.broadcast_in_dim %83, dims = [0] : (tensor<8xi32>) -> tensor<8x1xi32>
    %85 = "stablehlo.gather"(%33, %84) <{dimension_numbers = #stablehlo.gather<collapsed_slice_dims = [0], start_index_map = [0], index_vector_dim = 1>, indices_are_sorted = false, slice_sizes = array<i64: 1>}> : (tensor<6xi32>, tensor<8x1xi32>) -> tensor<8xi32>
    %86 = stablehlo.add %85, %66 : tensor<8xi32>
    %c_32 = stablehlo.constant dense<0> : tensor<i32>
    %87 = call @_where_5(%78, %86, %c_32) : (tensor<8xi1>, tensor<8xi32>, tensor<i32>) -> tensor<8xi32>
    %88 = stablehlo.broadcast_in_dim %87, dims = [0] : (tensor<8xi32>) -> tensor<8x1xi32>
    %89 = stablehlo.broadcast_in_dim %76, dims = [0] : (tensor<8xi32>) -> tensor<8x1xi32>
    %90 = stablehlo.concatenate %88, %89, dim = 1 : (tensor<8x1xi32>, tensor<8x1xi32>) -> tensor<8x2xi32>
    %91:2 = stablehlo.custom_call @gpuext_quantize_token_slots(%arg0, %90) {backend_config = "", mhlo.backend_config = {}, operand_layouts = [dense<[1, 0]> : tensor<2xindex>, dense<[1, 0]> : tensor<2xindex>], result_layouts = [dense<[1, 0]> : tensor<2xindex>, dense<[1, 0]> : tensor<2xindex>]} : (tensor<300x264xbf16>, tensor<8x2xi32>) -> (tensor<264x1024xf8E4M3FN>, tensor<8x264xf32>)
    %c_33 = stablehlo.constant dense<0> : tensor<i32>
    %c_34 = stablehlo.constant dense<300> : tensor<i32>
    %92 = call @clip(%arg1, %c_33, %c_34) : (tensor<5xi32>, tensor<i32>, tensor<i32>) -> tensor<5xi32>
    %93 = stablehlo.slice %92 [0:4:2] : (tensor<5xi32>) -> tensor<2xi32>
    %94 = stablehlo.slice %92 [1:5:2] : (tensor<5xi32>) -> tensor<2xi32>
    %95 = stablehlo.add %93, %94 : tensor<2xi32>
    %c_35 = stablehlo.constant dense<300> : tensor<i32>
    %96 = stablehlo.broadcast_in_dim %c_35, dims = [] : (tensor<i32>) -> tensor<2xi32>
    %97 = stablehlo.minimum %95, %96 : tensor<2xi32>
    %98 = stablehlo.slice %97 [0:1:2] : (tensor<2xi32>) -> tensor<1xi32>
    %99 = stablehlo.slice %97 [1:2:2] : (tensor<2xi32>) -> tensor<1xi32>
    %100 = stablehlo.add %98, %99 : tensor<1xi32>
    %c_36 = stablehlo.constant dense<300> : tensor<i32>
    %101 = stablehlo.broadcast_in_dim %c_36, dims = [] : (tensor<i32>) -> tensor<1xi32>
    %102 = stablehlo.minimum %100, %101 : tensor<1xi32>
    %103 = stablehlo.slice %102 [0:0] : (tensor<1xi32>) -> tensor<0xi32>
    %104 = stablehlo.slice %97 [2:2:2] : (tensor<2xi32>) -> tensor<0xi32>
    %105 = stablehlo.add %103, %104 : tensor<0xi32>
    %c_37 = stablehlo.constant dense<300> : tensor<i32>
    %106 = stablehlo.broadcast_in_dim %c_37, dims = [] : (tensor<i32>) -> tensor<0xi32>
    %107 = stablehlo.minimum %105, %106 : tensor<0xi32>
    %108 = stablehlo.slice %97 [0:1] : (tensor<2xi32>) -> tensor<1xi32>
    %109 = stablehlo.concatenate %108, %107, dim = 0 : (tensor<1xi32>, tensor<0xi32>) -> tensor<1xi32>
    %c_38 = stablehlo.constant dense<0> : tensor<i32>
    %110 = stablehlo.pad %109, %c_38, low = [0], high = [1], interior = [1] : (tensor<1xi32>, tensor<i32>) -> tensor<2xi32>
    %c_39 = stablehlo.constant dense<0> : tensor<i32>
    %111 = stablehlo.pad %102, %c_39, low = [1], high = [0], interior = [1] : (tensor<1xi32>, tensor<i32>) -> tensor<2xi32>
    %112 = stablehlo.add %110, %111 : tensor<2xi32>
    %113 = stablehlo.slice %92 [2:5:2] : (tensor<5xi32>) -> tensor<2xi32>
    %114 = stablehlo.add %112, %113 : tensor<2xi32>
    %c_40 = stablehlo.constant dense<300> : tensor<i32>
    %115 = stablehlo.broadcast_in_dim %c_40, dims = [] : (tensor<i32>) -> tensor<2xi32>
    %116 = stablehlo.minimum %114, %115 : tensor<2xi32>
    %117 = stablehlo.slice %92 [0:1] : (tensor<5xi32>) -> tensor<1xi32>
    %118 = stablehlo.concatenate %117, %116, dim = 0 : (tensor<1xi32>, tensor<2xi32>) -> tensor<3xi32>
    %c_41 = stablehlo.constant dense<0> : tensor<i32>
    %119 = stablehlo.pad %118, %c_41, low = [0], high = [0], interior = [1] : (tensor<3xi32>, tensor<i32>) -> tensor<5xi32>
    %c_42 = stablehlo.constant dense<0> : tensor<i32>
    %120 = stablehlo.pad %112, %c_42, low = [1], high = [1], interior = [1] : (tensor<2xi32>, tensor<i32>) -> tensor<5xi32>
    %121 = stablehlo.add %119, %120 : tensor<5xi32>
    %c_43 = stablehlo.constant dense<300> : tensor<i32>
    %122 = stablehlo.broadcast_in_dim %c_43, dims = [] : (tensor<i32>) -> tensor<1xi32>
    %123 = stablehlo.concatenate %121, %122, dim = 0 : (tensor<5xi32>, tensor<1xi32>) -> tensor<6xi32>
    %c_44 = stablehlo.constant dense<0> : tensor<i32>
    %124 = stablehlo.broadcast_in_dim %c_44, dims = [] : (tensor<i32>) -> tensor<1xi32>
    %125 = stablehlo.concatenate %124, %121, dim = 0 : (tensor<1xi32>, tensor<5xi32>) -> tensor<6xi32>
    %126 = stablehlo.subtract %123, %125 : tensor<6xi32>
    %c_45 = stablehlo.constant dense<127> : tensor<i32>
    %127 = stablehlo.broadcast_in_dim %c_45, dims = [] : (tensor<i32>) -> tensor<6xi32>
    %128 = stablehlo.add %126, %127 : tensor<6xi32>
    %c_46 = stablehlo.constant dense<128> : tensor<i32>
    %129 = call @floor_divide(%128, %c_46) : (tensor<6xi32>, tensor<i32>) -> tensor<6xi32>
    %130 = call @cumsum(%129) : (tensor<6xi32>) -> tensor<6xi32>
    %131 = stablehlo.subtract %130, %129 : tensor<6xi32>
    %132 = stablehlo.iota dim = 0 : tensor<300xi32>
    %133 = stablehlo.slice %125 [1:6] : (tensor<6xi32>) -> tensor<5xi32>
    %c_47 = stablehlo.constant dense<0> : tensor<i32>
    %c_48 = stablehlo.constant dense<300> : tensor<i32>
    %134 = call @clip(%133, %c_47, %c_48) : (tensor<5xi32>, tensor<i32>, tensor<i32>) -> tensor<5xi32>
    %c_49 = stablehlo.constant dense<0> : tensor<i32>
    %135 = stablehlo.broadcast_in_dim %c_49, dims = [] : (tensor<i32>) -> tensor<301xi32>
    %c_50 = stablehlo.constant dense<1> : tensor<i32>
    %136 = stablehlo.broadcast_in_dim %c_50, dims = [] : (tensor<i32>) -> tensor<5xi32>
    %c_51 = stablehlo.constant dense<0> : tensor<i32>
    %137 = stablehlo.broadcast_in_dim %c_51, dims = [] : (tensor<i32>) -> tensor<5xi32>
    %138 = stablehlo.compare LT, %134, %137, SIGNED : (tensor<5xi32>, tensor<5xi32>) -> tensor<5xi1>
    %c_52 = stablehlo.constant dense<301> : tensor<i32>
    %139 = stablehlo.broadcast_in_dim %c_52, dims = [] : (tensor<i32>) -> tensor<5xi32>
    %140 = stablehlo.add %134, %139 : tensor<5xi32>
    %141 = stablehlo.select %138, %140, %134 : tensor<5xi1>, tensor<5xi32>
    %142 = stablehlo.broadcast_in_dim %141, dims = [0] : (tensor<5xi32>) -> tensor<5x1xi32>
    %143 = "stablehlo.scatter"(%135, %142, %136) <{indices_are_sorted = false, scatter_dimension_numbers = #stablehlo.scatter<inserted_window_dims = [0], scatter_dims_to_operand_dims = [0], index_vector_dim = 1>, unique_indices = false}> ({
    ^bb0(%arg2: tensor<i32>, %arg3: tensor<i32>):
      %177 = stablehlo.add %arg2, %arg3 : tensor<i32>
      stablehlo.return %177 : tensor<i32>
    }) : (tensor<301xi32>, tensor<5x1xi32>, tensor<5xi32>) -> tensor<301xi32>
    %144 = stablehlo.slice %143 [0:300] : (tensor<301xi32>) -> tensor<300xi32>
    %145 = call @cumsum_6(%144) : (tensor<300xi32>) -> tensor<300xi32>
    %c_53 = stablehlo.constant dense<0> : tensor<i32>
    %146 = stablehlo.broadcast_in_dim %c_53, dims = [] : (tensor<i32>) -> tensor<300xi32>
    %147 = stablehlo.compare LT, %145, %146, SIGNED : (tensor<300xi32>, tensor<300xi32>) -> tensor<300xi1>
    %c_54 = stablehlo.constant dense<6> : tensor<i32>
    %148 = stablehlo.broadcast_in_dim %c_54, dims = [] : (tensor<i32>) -> tensor<300xi32>
    %149 = stablehlo.add %145, %148 : tensor<300xi32>
    %150 = stablehlo.select %147, %149, %145 : tensor<300xi1>, tensor<300xi32>
    %151 = stablehlo.broadcast_in_dim %150, dims = [0] : (tensor<300xi32>) -> tensor<300x1xi32>
    %152 = "stablehlo.gather"(%125, %151) <{dimension_numbers = #stablehlo.gather<collapsed_slice_dims = [0], start_index_map = [0], index_vector_dim = 1>, indices_are_sorted = false, slice_sizes = array<i64: 1>}> : (tensor<6xi32>, tensor<300x1xi32>) -> tensor<300xi32>
    %153 = stablehlo.subtract %132, %152 : tensor<300xi32>
    %c_55 = stablehlo.constant dense<0> : tensor<i32>
    %154 = stablehlo.broadcast_in_dim %c_55, dims = [] : (tensor<i32>) -> tensor<300xi32>
    %155 = stablehlo.compare LT, %145, %154, SIGNED : (tensor<300xi32>, tensor<300xi32>) -> tensor<300xi1>
    %c_56 = stablehlo.constant dense<6> : tensor<i32>
    %156 = stablehlo.broadcast_in_dim %c_56, dims = [] : (tensor<i32>) -> tensor<300xi32>
    %157 = stablehlo.add %145, %156 : tensor<300xi32>
    %158 = stablehlo.select %155, %157, %145 : tensor<300xi1>, tensor<300xi32>
    %159 = stablehlo.broadcast_in_dim %158, dims = [0] : (tensor<300xi32>) -> tensor<300x1xi32>
    %160 = "stablehlo.gather"(%131, %159) <{dimension_numbers = #stablehlo.gather<collapsed_slice_dims = [0], start_index_map = [0], index_vector_dim = 1>, indices_are_sorted = false, slice_sizes = array<i64: 1>}> : (tensor<6xi32>, tensor<300x1xi32>) -> tensor<300xi32>
    %c_57 = stablehlo.constant dense<128> : tensor<i32>
    %161 = call @floor_divide_8(%153, %c_57) : (tensor<300xi32>, tensor<i32>) -> tensor<300xi32>
    %162 = stablehlo.add %160, %161 : tensor<300xi32>
    %c_58 = stablehlo.constant dense<128> : tensor<i32>
    %163 = call @remainder(%153, %c_58) : (tensor<300xi32>, tensor<i32>) -> tensor<300xi32>
    %c_59 = stablehlo.constant dense<128> : tensor<i32>
    %164 = stablehlo.broadcast_in_dim %c_59, dims = [] : (tensor<i32>) -> tensor<300xi32>
    %165 = stablehlo.multiply %162, %164 : tensor<300xi32>
    %166 = stablehlo.add %165, %163 : tensor<300xi32>
    %167 = stablehlo.bitcast_convert %91#0 : (tensor<264x1024xf8E4M3FN>) -> tensor<264x1024xui8>
    %c_60 = stablehlo.constant dense<90> : tensor<ui8>
    %168 = stablehlo.broadcast_in_dim %c_60, dims = [] : (tensor<ui8>) -> tensor<264x1024xui8>
    %169 = stablehlo.xor %167, %168 : tensor<264x1024xui8>
    %170 = call @_take(%169, %166) : (tensor<264x1024xui8>, tensor<300xi32>) -> tensor<264x300xui8>
    %c_61 = stablehlo.constant dense<90> : tensor<ui8>
    %171 = stablehlo.broadcast_in_dim %c_61, dims = [] : (tensor<ui8>) -> tensor<264x300xui8>
    %172 = stablehlo.xor %170, %171 : tensor<264x300xui8>
    %173 = stablehlo.bitcast_convert %172 : (tensor<264x300xui8>) -> tensor<264x300xf8E4M3FN>
    %174 = stablehlo.transpose %173, dims = [1, 0] : (tensor<264x300xf8E4M3FN>) -> tensor<300x264xf8E4M3FN>
    %175 = stablehlo.transpose %174, dims = [1, 0] : (tensor<300x264xf8E4M3FN>) -> tensor<264x300xf8E4M3FN>
    %176 = stablehlo.transpose %91#1, dims = [1, 0] : (tensor<8x264xf32>) -> tensor<264x8xf32>
    return %175, %176, %91#0 : tensor<264x300xf8E4M3FN>, tensor<264x8xf32>, tensor<264x1024xf8E4M3FN>
  }
  func.func private @clip(%arg0: tensor<5xi32>, %arg1: tensor<i32>, %arg2: tensor<i32>) -> tensor<5xi32> {
    %0 = stablehlo.convert %arg1 : tensor<i32>
    %1 = stablehlo.broadcast_in_dim %0, dims = [] : (tensor<i32>) -> tensor<5xi32>
    %2 = stablehlo.maximum %1, %arg0 : tensor<5xi32>
    %3 = stablehlo.convert %arg2 : tensor<i32>
    %4 = stablehlo.broadcast_in_dim %3, dims = [] : (tensor<i32>) -> tensor<5xi32>
    %5 = stablehlo.minimum %4, %2 : tensor<5xi32>
    return %5 : tensor<5xi32>
  }
  func.func private @floor_divide(%arg0: tensor<6xi32>, %arg1: tensor<i32>) -> tensor<6xi32> {
    %0 = stablehlo.convert %arg1 : tensor<i32>
    %1 = stablehlo.broadcast_in_dim %0, dims = [] : (tensor<i32>) -> tensor<6xi32>
    %2 = stablehlo.divide %arg0, %1 : tensor<6xi32>
    %3 = stablehlo.sign %arg0 : tensor<6xi32>
    %4 = stablehlo.sign %0 : tensor<i32>
    %5 = stablehlo.broadcast_in_dim %4, dims = [] : (tensor<i32>) -> tensor<6xi32>
    %6 = stablehlo.compare NE, %3, %5, SIGNED : (tensor<6xi32>, tensor<6xi32>) -> tensor<6xi1>
    %7 = stablehlo.broadcast_in_dim %0, dims = [] : (tensor<i32>) -> tensor<6xi32>
    %8 = stablehlo.remainder %arg0, %7 : tensor<6xi32>
    %c = stablehlo.constant dense<0> : tensor<i32>
    %9 = stablehlo.broadcast_in_dim %c, dims = [] : (tensor<i32>) -> tensor<6xi32>
    %10 = stablehlo.compare NE, %8, %9, SIGNED : (tensor<6xi32>, tensor<6xi32>) -> tensor<6xi1>
    %11 = stablehlo.and %6, %10 : tensor<6xi1>
    %c_0 = stablehlo.constant dense<1> : tensor<i32>
    %12 = stablehlo.broadcast_in_dim %c_0, dims = [] : (tensor<i32>) -> tensor<6xi32>
    %13 = stablehlo.subtract %2, %12 : tensor<6xi32>
    %14 = call @_where(%11, %13, %2) : (tensor<6xi1>, tensor<6xi32>, tensor<6xi32>) -> tensor<6xi32>
    return %14 : tensor<6xi32>
  }
  func.func private @_where(%arg0: tensor<6xi1>, %arg1: tensor<6xi32>, %arg2: tensor<6xi32>) -> tensor<6xi32> {
    %0 = stablehlo.select %arg0, %arg1, %arg2 : tensor<6xi1>, tensor<6xi32>
    return %0 : tensor<6xi32>
  }
  func.func private @cumsum(%arg0: tensor<6xi32>) -> tensor<6xi32> {
    %0 = call @cumsum_0(%arg0) : (tensor<6xi32>) -> tensor<6xi32>
    return %0 : tensor<6xi32>
  }
  func.func private @cumsum_0(%arg0: tensor<6xi32>) -> tensor<6xi32> {
    %c = stablehlo.constant dense<0> : tensor<i32>
    %0 = stablehlo.broadcast_in_dim %c, dims = [] : (tensor<i32>) -> tensor<i32>
    %1 = "stablehlo.reduce_window"(%arg0, %0) <{base_dilations = array<i64: 1>, padding = dense<[[5, 0]]> : tensor<1x2xi64>, window_dilations = array<i64: 1>, window_dimensions = array<i64: 6>, window_strides = array<i64: 1>}> ({
    ^bb0(%arg1: tensor<i32>, %arg2: tensor<i32>):
      %2 = stablehlo.add %arg1, %arg2 : tensor<i32>
      stablehlo.return %2 : tensor<i32>
    }) : (tensor<6xi32>, tensor<i32>) -> tensor<6xi32>
    return %1 : tensor<6xi32>
  }
  func.func private @clip_1(%arg0: tensor<6xi32>, %arg1: tensor<i32>, %arg2: tensor<i32>) -> tensor<6xi32> {
    %0 = stablehlo.convert %arg1 : tensor<i32>
    %1 = stablehlo.broadcast_in_dim %0, dims = [] : (tensor<i32>) -> tensor<6xi32>
    %2 = stablehlo.maximum %1, %arg0 : tensor<6xi32>
    %3 = stablehlo.convert %arg2 : tensor<i32>
    %4 = stablehlo.broadcast_in_dim %3, dims = [] : (tensor<i32>) -> tensor<6xi32>
    %5 = stablehlo.minimum %4, %2 : tensor<6xi32>
    return %5 : tensor<6xi32>
  }
  func.func private @cumsum_2(%arg0: tensor<8xi32>) -> tensor<8xi32> {
    %0 = call @cumsum_3(%arg0) : (tensor<8xi32>) -> tensor<8xi32>
    return %0 : tensor<8xi32>
  }
  func.func private @cumsum_3(%arg0: tensor<8xi32>) -> tensor<8xi32> {
    %c = stablehlo.constant dense<0> : tensor<i32>
    %0 = stablehlo.broadcast_in_dim %c, dims = [] : (tensor<i32>) -> tensor<i32>
    %1 = "stablehlo.reduce_window"(%arg0, %0) <{base_dilations = array<i64: 1>, padding = dense<[[7, 0]]> : tensor<1x2xi64>, window_dilations = array<i64: 1>, window_dimensions = array<i64: 8>, window_strides = array<i64: 1>}> ({
    ^bb0(%arg1: tensor<i32>, %arg2: tensor<i32>):
      %2 = stablehlo.add %arg1, %arg2 : tensor<i32>
      stablehlo.return %2 : tensor<i32>
    }) : (tensor<8xi32>, tensor<i32>) -> tensor<8xi32>
    return %1 : tensor<8xi32>
  }
  func.func private @clip_4(%arg0: tensor<8xi32>, %arg1: tensor<i32>, %arg2: tensor<i32>) -> tensor<8xi32> {
    %0 = stablehlo.convert %arg1 : tensor<i32>
    %1 = stablehlo.broadcast_in_dim %0, dims = [] : (tensor<i32>) -> tensor<8xi32>
    %2 = stablehlo.maximum %1, %arg0 : tensor<8xi32>
    %3 = stablehlo.convert %arg2 : tensor<i32>
    %4 = stablehlo.broadcast_in_dim %3, dims = [] : (tensor<i32>) -> tensor<8xi32>
    %5 = stablehlo.minimum %4, %2 : tensor<8xi32>
    return %5 : tensor<8xi32>
  }
  func.func private @_where_5(%arg0: tensor<8xi1>, %arg1: tensor<8xi32>, %arg2: tensor<i32>) -> tensor<8xi32> {
    %0 = stablehlo.convert %arg2 : tensor<i32>
    %1 = stablehlo.broadcast_in_dim %0, dims = [] : (tensor<i32>) -> tensor<8xi32>
    %2 = stablehlo.select %arg0, %arg1, %1 : tensor<8xi1>, tensor<8xi32>
    return %2 : tensor<8xi32>
  }
  func.func private @cumsum_6(%arg0: tensor<300xi32>) -> tensor<300xi32> {
    %0 = call @cumsum_7(%arg0) : (tensor<300xi32>) -> tensor<300xi32>
    return %0 : tensor<300xi32>
  }
  func.func private @cumsum_7(%arg0: tensor<300xi32>) -> tensor<300xi32> {
    %c = stablehlo.constant dense<0> : tensor<i32>
    %0 = stablehlo.broadcast_in_dim %c, dims = [] : (tensor<i32>) -> tensor<i32>
    %1 = "stablehlo.reduce_window"(%arg0, %0) <{base_dilations = array<i64: 1>, padding = dense<[[299, 0]]> : tensor<1x2xi64>, window_dilations = array<i64: 1>, window_dimensions = array<i64: 300>, window_strides = array<i64: 1>}> ({
    ^bb0(%arg1: tensor<i32>, %arg2: tensor<i32>):
      %2 = stablehlo.add %arg1, %arg2 : tensor<i32>
      stablehlo.return %2 : tensor<i32>
    }) : (tensor<300xi32>, tensor<i32>) -> tensor<300xi32>
    return %1 : tensor<300xi32>
  }
  func.func private @floor_divide_8(%arg0: tensor<300xi32>, %arg1: tensor<i32>) -> tensor<300xi32> {
    %0 = stablehlo.convert %arg1 : tensor<i32>
    %1 = stablehlo.broadcast_in_dim %0, dims = [] : (tensor<i32>) -> tensor<300xi32>
    %2 = stablehlo.divide %arg0, %1 : tensor<300xi32>
    %3 = stablehlo.sign %arg0 : tensor<300xi32>
    %4 = stablehlo.sign %0 : tensor<i32>
    %5 = stablehlo.broadcast_in_dim %4, dims = [] : (tensor<i32>) -> tensor<300xi32>
    %6 = stablehlo.compare NE, %3, %5, SIGNED : (tensor<300xi32>, tensor<300xi32>) -> tensor<300xi1>
    %7 = stablehlo.broadcast_in_dim %0, dims = [] : (tensor<i32>) -> tensor<300xi32>
    %8 = stablehlo.remainder %arg0, %7 : tensor<300xi32>
    %c = stablehlo.constant dense<0> : tensor<i32>
    %9 = stablehlo.broadcast_in_dim %c, dims = [] : (tensor<i32>) -> tensor<300xi32>
    %10 = stablehlo.compare NE, %8, %9, SIGNED : (tensor<300xi32>, tensor<300xi32>) -> tensor<300xi1>
    %11 = stablehlo.and %6, %10 : tensor<300xi1>
    %c_0 = stablehlo.constant dense<1> : tensor<i32>
    %12 = stablehlo.broadcast_in_dim %c_0, dims = [] : (tensor<i32>) -> tensor<300xi32>
    %13 = stablehlo.subtract %2, %12 : tensor<300xi32>
    %14 = call @_where_9(%11, %13, %2) : (tensor<300xi1>, tensor<300xi32>, tensor<300xi32>) -> tensor<300xi32>
    return %14 : tensor<300xi32>
  }
  func.func private @_where_9(%arg0: tensor<300xi1>, %arg1: tensor<300xi32>, %arg2: tensor<300xi32>) -> tensor<300xi32> {
    %0 = stablehlo.select %arg0, %arg1, %arg2 : tensor<300xi1>, tensor<300xi32>
    return %0 : tensor<300xi32>
  }
  func.func private @remainder(%arg0: tensor<300xi32>, %arg1: tensor<i32>) -> tensor<300xi32> {
    %0 = stablehlo.convert %arg1 : tensor<i32>
    %c = stablehlo.constant dense<0> : tensor<i32>
    %1 = stablehlo.compare EQ, %0, %c, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
    %c_0 = stablehlo.constant dense<1> : tensor<i32>
    %2 = call @_where_10(%1, %c_0, %0) : (tensor<i1>, tensor<i32>, tensor<i32>) -> tensor<i32>
    %3 = stablehlo.broadcast_in_dim %2, dims = [] : (tensor<i32>) -> tensor<300xi32>
    %4 = stablehlo.remainder %arg0, %3 : tensor<300xi32>
    %c_1 = stablehlo.constant dense<0> : tensor<i32>
    %5 = stablehlo.broadcast_in_dim %c_1, dims = [] : (tensor<i32>) -> tensor<300xi32>
    %6 = stablehlo.compare NE, %4, %5, SIGNED : (tensor<300xi32>, tensor<300xi32>) -> tensor<300xi1>
    %c_2 = stablehlo.constant dense<0> : tensor<i32>
    %7 = stablehlo.broadcast_in_dim %c_2, dims = [] : (tensor<i32>) -> tensor<300xi32>
    %8 = stablehlo.compare LT, %4, %7, SIGNED : (tensor<300xi32>, tensor<300xi32>) -> tensor<300xi1>
    %c_3 = stablehlo.constant dense<0> : tensor<i32>
    %9 = stablehlo.compare LT, %2, %c_3, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
    %10 = stablehlo.broadcast_in_dim %9, dims = [] : (tensor<i1>) -> tensor<300xi1>
    %11 = stablehlo.compare NE, %8, %10, UNSIGNED : (tensor<300xi1>, tensor<300xi1>) -> tensor<300xi1>
    %12 = stablehlo.and %11, %6 : tensor<300xi1>
    %13 = stablehlo.broadcast_in_dim %2, dims = [] : (tensor<i32>) -> tensor<300xi32>
    %14 = stablehlo.add %4, %13 : tensor<300xi32>
    %15 = stablehlo.select %12, %14, %4 : tensor<300xi1>, tensor<300xi32>
    return %15 : tensor<300xi32>
  }
  func.func private @_where_10(%arg0: tensor<i1>, %arg1: tensor<i32>, %arg2: tensor<i32>) -> tensor<i32> {
    %0 = stablehlo.select %arg0, %arg1, %arg2 : tensor<i1>, tensor<i32>
    return %0 : tensor<i32>
  }
  func.func private @_take(%arg0: tensor<264x1024xui8>, %arg1: tensor<300xi32>) -> tensor<264x300xui8> {
    %0 = stablehlo.broadcast_in_dim %arg1, dims = [0] : (tensor<300xi32>) -> tensor<300x1xi32>
    %1 = "stablehlo.gather"(%arg0, %0) <{dimension_numbers = #stablehlo.gather<offset_dims = [0], collapsed_slice_dims = [1], start_index_map = [1], index_vector_dim = 1>, indices_are_sorted = false, slice_sizes = array<i64: 264, 1>}> : (tensor<264x1024xui8>, tensor<300x1xi32>) -> tensor<264x300xui8>
    return %1 : tensor<264x300xui8>
  }
}
